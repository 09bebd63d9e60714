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

// The query tails' kernel, launched by the engine during prefill, not by compress_async.
template <class T>
Status instantiate_tails(KVView<const T> q, std::int64_t first, KVView<const T> k, const float* lse,
                         TailView<float> tails, const QueryTailOptions& o, cudaStream_t s) {
  return query_tails_async(q, first, k, lse, tails, o, s);
}

template Status instantiate_tails<float>(KVView<const float>, std::int64_t, KVView<const float>, const float*,
                                         TailView<float>, const QueryTailOptions&, cudaStream_t);
template Status instantiate_tails<half_t>(KVView<const half_t>, std::int64_t, KVView<const half_t>, const float*,
                                          TailView<float>, const QueryTailOptions&, cudaStream_t);
template Status instantiate_tails<bfloat16_t>(KVView<const bfloat16_t>, std::int64_t, KVView<const bfloat16_t>,
                                              const float*, TailView<float>, const QueryTailOptions&, cudaStream_t);

}  // namespace flashcache::gpu::static_report
