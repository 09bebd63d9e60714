# flashcache_engine_runtime: the engine's runtime (tools/engine_runtime/, headers only,
# namespace engine): GGUF reader, BPE tokenizer, Llama decoder, greedy generation, and the
# model finder (tools/find_model, target flashcache_find_model).
# Included, not added as a subdirectory, by every build that uses it (the engine, the fuzz
# target, the CLI's fuzz regression test), whichever comes first:
#   include(${PROJECT_SOURCE_DIR}/tools/engine_runtime/engine_runtime.cmake)
# Consumers include the headers as "engine_runtime/gguf.hpp", "engine_runtime/model.hpp", ...
include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/../find_model/find_model.cmake)

get_filename_component(_fc_tools_dir ${CMAKE_CURRENT_LIST_DIR} DIRECTORY)  # tools
add_library(flashcache_engine_runtime INTERFACE)
target_include_directories(flashcache_engine_runtime INTERFACE ${_fc_tools_dir})
target_compile_features(flashcache_engine_runtime INTERFACE cxx_std_17)
target_link_libraries(flashcache_engine_runtime INTERFACE Eigen3::Eigen flashcache_find_model)
# model.hpp runs its loops on OpenMP threads; gguf.hpp and tokenizer.hpp need
# nothing but the standard library (the fuzz target uses only those two and builds without it).
find_package(OpenMP COMPONENTS CXX QUIET)
if(OpenMP_CXX_FOUND)
  target_link_libraries(flashcache_engine_runtime INTERFACE OpenMP::OpenMP_CXX)
endif()

# flashcache_engine_core: the runtime plus its flashcache integration (compress_cache.hpp), what
# the engine's program (examples/engine), its tests (tests/engine) and its benchmark (bench/engine) link.
# Decoding is bound by vector loads and FMAs: built for this machine's SIMD unless told otherwise
# (the project's FLASHCACHE_NATIVE_FLAGS, AVX-512 off: see the top-level CMakeLists).
add_library(flashcache_engine_core INTERFACE)
target_link_libraries(flashcache_engine_core INTERFACE flashcache_engine_runtime flashcache::flashcache)
option(FLASHCACHE_ENGINE_NATIVE "Build the engine's programs and tests with -march=native (AVX-512 off)" ON)
if(FLASHCACHE_ENGINE_NATIVE AND FLASHCACHE_HAS_NATIVE_FLAGS)
  target_compile_options(flashcache_engine_core INTERFACE ${FLASHCACHE_NATIVE_FLAGS})
endif()

# Whether the engine's programs (examples/engine, bench/engine) can be built here: they need OpenMP,
# CLI11 and nlohmann_json. A function, so that the imported targets land in the calling directory.
function(flashcache_engine_programs_found out)
  find_package(OpenMP COMPONENTS CXX QUIET)
  find_package(CLI11 CONFIG QUIET)
  find_package(nlohmann_json 3.2 CONFIG QUIET)
  if(OpenMP_CXX_FOUND AND CLI11_FOUND AND nlohmann_json_FOUND)
    set(${out} ON PARENT_SCOPE)
  else()
    set(${out} OFF PARENT_SCOPE)
  endif()
endfunction()
