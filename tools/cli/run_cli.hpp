#pragma once
// The whole `flashcache` command line as a function, so that tests and the
// fuzzer can run it in-process; main() only forwards to it.

namespace flashcache::cli {

// Parses argv, runs the subcommand and returns the exit code. Never throws:
// every failure is one line "flashcache: <message>" on stderr and code 1 or 2.
int run_cli(int argc, char** argv);

}  // namespace flashcache::cli
