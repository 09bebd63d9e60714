# flashcache_llama_session: tools/llama_session/session.hpp (a small llama.cpp session: load a
# model, make a context, tokenize, prefill, decode, watch n_kv), headers only, for the llama.cpp
# adapter's tests, its measuring programs (bench/llama_cpp) and tools/hops. Included, not added
# as a subdirectory, by every build that uses it, once llama.cpp is found:
#   include(${PROJECT_SOURCE_DIR}/tools/llama_session/llama_session.cmake)
# Consumers include it as "llama_session/session.hpp".
include_guard(GLOBAL)

get_filename_component(_fc_tools_dir ${CMAKE_CURRENT_LIST_DIR} DIRECTORY)  # tools
add_library(flashcache_llama_session INTERFACE)
target_include_directories(flashcache_llama_session INTERFACE ${_fc_tools_dir})
target_link_libraries(flashcache_llama_session INTERFACE flashcache::llama_cpp)
