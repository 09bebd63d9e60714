#!/usr/bin/env bash
# The hop walk (how many times a call crosses from one header into another): one flashcache::llama::compress_sequence call (SmolLM2-135M, 256 tokens,
# the defaults), every function of the project's headers it enters logged by -finstrument-functions,
# then the calls that cross from one file into another counted (hops.py). Needs llama-cpp-python
# 0.3.36 and the model, as the adapter's tests do.
#   tools/hops/hops.sh [source tree, default this one]   (a tree of another commit: git worktree add)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tree=$(cd "${1:-$here/../..}" && pwd)
site=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
commit=$(sed -n 's/.*kPinnedLlamaCommit = "\(.*\)";/\1/p' "$tree/include/flashcache/llama/state/format.hpp")
g++ -std=c++17 -O0 -g -no-pie -finstrument-functions \
  "-finstrument-functions-exclude-file-list=/usr/,$site,bench/,examples/,tools/" \
  -I"$tree/include" -I"$tree/tools" -isystem /usr/include/eigen3 \
  -isystem "$site/include" -DFLASHCACHE_HAVE_LLAMA=1 "-DFLASHCACHE_LLAMA_BUILD_COMMIT=\"$commit\"" \
  "$here/hop_walk.cpp" -o "$work/hop_walk" -L"$site/lib" -Wl,-rpath,"$site/lib" -lllama -pthread
"$work/hop_walk" "$work/edges.txt"
python3 "$here/hops.py" "$work/hop_walk" "$work/edges.txt" "$tree"
