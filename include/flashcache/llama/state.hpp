#pragma once
// llama.cpp's state blob of one sequence (llama_state_seq_get_data), read and
// written on bytes, without llama.h: what tests and fuzzers exercise, and what
// flashcache/llama/compress.hpp uses to compact a sequence.
//   format.hpp  the format (pinned llama.cpp version) and its parser
//   write.hpp   a blob of only the kept cells
//   rows.hpp    K and V rows as float
#include "flashcache/llama/format.hpp"
#include "flashcache/llama/rows.hpp"
#include "flashcache/llama/write.hpp"
