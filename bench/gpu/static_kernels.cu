// Every kernel the GPU API launches, instantiated for float, half and
// bfloat16: compiled to an sm_90 cubin by bench/gpu/static_report.sh, which
// reads registers, spills and shared memory from ptxas and instruction counts
// from the SASS. Never run.
#include "flashcache/cuda/compress.cuh"

namespace flashcache::gpu::static_report {

template <class T>
Status instantiate(const Cache<T>& c, const Budget& b, const Options& o, const Outputs<T>& out, void* ws,
                   std::size_t bytes, cudaStream_t s, const GlobalTransform* plan) {
  return compress_async(c, b, o, out, ws, bytes, s, plan);
}

template Status instantiate<float>(const Cache<float>&, const Budget&, const Options&, const Outputs<float>&, void*,
                                   std::size_t, cudaStream_t, const GlobalTransform*);
template Status instantiate<half_t>(const Cache<half_t>&, const Budget&, const Options&, const Outputs<half_t>&, void*,
                                    std::size_t, cudaStream_t, const GlobalTransform*);
template Status instantiate<bfloat16_t>(const Cache<bfloat16_t>&, const Budget&, const Options&,
                                        const Outputs<bfloat16_t>&, void*, std::size_t, cudaStream_t,
                                        const GlobalTransform*);

}  // namespace flashcache::gpu::static_report
