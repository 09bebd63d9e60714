#pragma once
// The llama.cpp adapter (needs llama.h; link flashcache::llama_cpp):
//   llama/compress.hpp  compact one sequence (SequenceCompressor, compress_sequence)
//   llama/params.hpp    a compaction's inputs and report (CompressParams, CompactionStats)
//   llama/checks.hpp    what the adapter supports, checked by name
//   llama/context.hpp   compress when the context fills (ContextManager)
//   llama/queries.hpp   the prompt's queries during prefill (QueryCapture)
//   llama/state.hpp     the sequence state blob, without llama.h
#include "flashcache/llama/checks.hpp"
#include "flashcache/llama/compress.hpp"
#include "flashcache/llama/context.hpp"
#include "flashcache/llama/evict.hpp"
#include "flashcache/llama/params.hpp"
#include "flashcache/llama/queries.hpp"
#include "flashcache/llama/recall.hpp"
#include "flashcache/llama/state.hpp"
#include "flashcache/llama/state_io.hpp"
