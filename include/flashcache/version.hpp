#pragma once
// flashcache version; kept in step with project(VERSION) in CMakeLists.txt.
#define FLASHCACHE_VERSION_MAJOR 0
#define FLASHCACHE_VERSION_MINOR 1
#define FLASHCACHE_VERSION_PATCH 0
#define FLASHCACHE_VERSION_STRING "0.1.0"

namespace flashcache {
inline constexpr const char* version_string() { return FLASHCACHE_VERSION_STRING; }
}  // namespace flashcache
