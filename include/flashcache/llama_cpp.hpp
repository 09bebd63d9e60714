#pragma once
// Deprecated: include <flashcache/llama.hpp>, the umbrella of the llama.cpp
// adapter's headers in flashcache/llama/ (this one forwards to it).
#ifndef FLASHCACHE_NO_DEPRECATION_WARNINGS
#warning "<flashcache/llama_cpp.hpp> is deprecated: include <flashcache/llama.hpp>"
#endif
#include "flashcache/llama.hpp"
