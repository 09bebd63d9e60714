#pragma once
// llama.cpp's state blob of one sequence (llama_state_seq_get_data), read and
// written on bytes, without llama.h: what tests and fuzzers exercise, and what
// flashcache/llama_cpp.hpp uses to compact a sequence.
//   llama/format.hpp  the format (pinned llama.cpp version) and its parser
//   llama/write.hpp   a blob of only the kept cells
//   llama/rows.hpp    K and V rows as float
#include "flashcache/llama/format.hpp"
#include "flashcache/llama/rows.hpp"
#include "flashcache/llama/write.hpp"
