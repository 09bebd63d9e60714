# Tests build at -O2 in Release (in the folder that includes this and those below it): optimised as
# engines build the headers (-O2 or -O3), in about two thirds of -O3's compile time, which CI pays for
# every test file. The benchmarks, tools and the Python module keep the build type's flags.
string(REPLACE "-O3" "-O2" CMAKE_CXX_FLAGS_RELEASE "${CMAKE_CXX_FLAGS_RELEASE}")
string(REPLACE "-O3" "-O2" CMAKE_CUDA_FLAGS_RELEASE "${CMAKE_CUDA_FLAGS_RELEASE}")
