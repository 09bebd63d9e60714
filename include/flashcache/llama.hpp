#pragma once
// The llama.cpp adapter (needs llama.h; link flashcache::llama_cpp), in levels,
// each built on the one below:
//   bytes      llama/state.hpp      the sequence state blob, without llama.h (state/)
//   sequence   llama/sequence.hpp   one sequence as a transaction: read, check, write, replace
//              llama/checks.hpp     what the adapter supports, checked by name
//              llama/queries.hpp    the queries decoded, captured through cb_eval (QueryCapture)
//   operations llama/compress.hpp   compact one sequence (SequenceCompressor; params.hpp)
//              llama/recall.hpp     bring archived cells back at a new turn (TurnRecaller;
//                                   recall_params.hpp)
//   context    llama/context.hpp    compress when the context fills (ContextManager;
//                                   context_params.hpp)
#include "flashcache/llama/checks.hpp"
#include "flashcache/llama/compress.hpp"
#include "flashcache/llama/context.hpp"
#include "flashcache/llama/context_params.hpp"
#include "flashcache/llama/params.hpp"
#include "flashcache/llama/queries.hpp"
#include "flashcache/llama/recall.hpp"
#include "flashcache/llama/recall_params.hpp"
#include "flashcache/llama/sequence.hpp"
#include "flashcache/llama/state.hpp"
