// The `flashcache` command-line tool; the work is in run_cli.cpp (callable in-process by the fuzzer).
#include "run_cli.hpp"

int main(int argc, char** argv) { return flashcache::cli::run_cli(argc, argv); }
