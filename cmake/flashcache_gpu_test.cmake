# flashcache_gpu_test(<name> SOURCES <file>... [LIBRARIES <target>...] [LABELS <label>...])
# One GPU test executable, test_<name>: built with nvcc for the configured
# architectures, linked to flashcache::cuda and GoogleTest's main, its tests
# registered as "<name>.<suite>.<test>" so that `ctest -R gpu` selects them.
# Tests that need a device GTEST_SKIP without one.
find_package(GTest REQUIRED)
include(GoogleTest)

function(flashcache_gpu_test name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;LIBRARIES;LABELS")
  add_executable(test_${name} ${arg_SOURCES})
  target_link_libraries(test_${name} PRIVATE ${arg_LIBRARIES} flashcache::cuda flashcache_project_flags
                                              GTest::gtest_main)
  target_compile_features(test_${name} PRIVATE cuda_std_17)
  set(properties TIMEOUT 300)
  if(arg_LABELS)
    list(APPEND properties LABELS "${arg_LABELS}")
  endif()
  gtest_discover_tests(test_${name} TEST_PREFIX "${name}." DISCOVERY_TIMEOUT 60 PROPERTIES ${properties})
endfunction()
