#pragma once
// Deprecated: include <flashcache/llama/state.hpp> (the adapter's headers live in
// flashcache/llama/, with <flashcache/llama.hpp> as their umbrella).
#ifndef FLASHCACHE_NO_DEPRECATION_WARNINGS
#warning "<flashcache/llama_state.hpp> is deprecated: include <flashcache/llama/state.hpp>"
#endif
#include "flashcache/llama/state.hpp"
