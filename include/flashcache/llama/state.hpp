#pragma once
// The bytes level of the llama.cpp adapter: one sequence's state blob
// (llama_state_seq_get_data), read and written without llama.h. What tests and
// fuzzers exercise, and what llama/sequence.hpp builds on.
//   state/format.hpp  the format (pinned llama.cpp version) and its parser
//   state/rows.hpp    K and V rows as float
//   state/write.hpp   a blob of chosen cells (kept, or merged with archived rows)
//   state/evict.hpp   the archive's row types and shape for a state
#include "flashcache/llama/state/evict.hpp"
#include "flashcache/llama/state/format.hpp"
#include "flashcache/llama/state/rows.hpp"
#include "flashcache/llama/state/write.hpp"
