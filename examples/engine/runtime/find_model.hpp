#pragma once
// The engine's names for the model finder, which lives in tools/find_model/ (target
// flashcache_find_model, linked by flashcache_engine_runtime).
#include "find_model/find_model.hpp"

namespace engine {

using flashcache::model_finder::find_default_model;
using flashcache::model_finder::model_install_hint;

}  // namespace engine
