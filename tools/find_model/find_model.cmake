# flashcache_find_model: tools/find_model/find_model.hpp (the default model's path), headers only.
# Included, not added as a subdirectory, by every build that uses it (the engine's runtime, the
# llama.cpp examples, their benchmarks and tests), whichever comes first:
#   include(${PROJECT_SOURCE_DIR}/tools/find_model/find_model.cmake)
# Consumers include it as "find_model/find_model.hpp".
include_guard(GLOBAL)

get_filename_component(_fc_tools_dir ${CMAKE_CURRENT_LIST_DIR} DIRECTORY)  # tools
add_library(flashcache_find_model INTERFACE)
target_include_directories(flashcache_find_model INTERFACE ${_fc_tools_dir})
target_compile_features(flashcache_find_model INTERFACE cxx_std_17)
