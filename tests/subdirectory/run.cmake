# Configures, builds, runs and installs a parent project that vendors
# flashcache with add_subdirectory(), then checks that the parent's install
# holds only the parent's files. The parent is configured with nvcc on the
# PATH when the machine has one: flashcache must still leave CUDA off.
# Invoked as: cmake -DFLASHCACHE_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DCXX=... -P run.cmake
file(REMOVE_RECURSE ${WORK_DIR})
foreach(step
    "${CMAKE_COMMAND};-S;${SOURCE_DIR};-B;${WORK_DIR}/build;-DFLASHCACHE_DIR=${FLASHCACHE_DIR};-DCMAKE_CXX_COMPILER=${CXX}"
    "${CMAKE_COMMAND};--build;${WORK_DIR}/build"
    "${CMAKE_COMMAND};--install;${WORK_DIR}/build;--prefix;${WORK_DIR}/prefix"
    "${WORK_DIR}/build/parent")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${step}\n${out}\n${err}")
  endif()
endforeach()
file(GLOB_RECURSE installed RELATIVE ${WORK_DIR}/prefix ${WORK_DIR}/prefix/*)
if(NOT installed STREQUAL "bin/parent")
  message(FATAL_ERROR "the parent's install holds more than its program: ${installed}")
endif()
message(STATUS "${out}")
