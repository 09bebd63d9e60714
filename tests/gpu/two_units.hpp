#pragma once
// Two translation units that both include the GPU front door (two_units_a.cu,
// two_units_b.cu) and are linked into one program: a kernel or host function
// defined in a header without vague or internal linkage fails that link with
// "multiple definition". Each unit also instantiates the whole run path.
#include <string>

namespace flashcache::two_units {

// What compress_async says about a valid cache with no workspace; the same
// message from both units (each compiled its own copy of the run path).
std::string run_without_workspace_a();
std::string run_without_workspace_b();

}  // namespace flashcache::two_units
