#!/usr/bin/env bash
# Installs what flashcache needs to build and test, from Debian's packages.
# Idempotent: packages already present are left alone, and apt is not touched
# at all when nothing is missing. The CUDA toolkit is optional and not installed here.
set -euo pipefail

# Arguments name more packages to install the same way (e.g. the long-context harness's doc-debian python3.11-doc).
packages=(cmake g++ make libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
