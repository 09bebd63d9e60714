// Compress a small two-sequence KV cache on the GPU and print what was kept.
//
//   1. fill device buffers (one layer, NHD: [tokens][heads][head_dim], bf16)
//   2. ask for the workspace size, allocate it once
//   3. run compress_async on a stream (no host sync, no allocation inside)
//   4. read the device status and the kept indices back
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "flashcache/cuda/compress.cuh"
#include "example_checks.hpp"

namespace fcc = flashcache::gpu;
using flashcache::bfloat16_t;


int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("No CUDA device found: this example needs a GPU. Nothing to do.\n");
    return 0;
  }
  constexpr int kHeads = 2, kHeadDim = 64;
  const std::vector<std::int32_t> indptr = {0, 40, 100};  // two sequences: 40 and 60 tokens
  const std::int64_t tokens = indptr.back();

  // Smooth rows with a few outliers every 13 tokens.
  std::vector<bfloat16_t> k(static_cast<std::size_t>(tokens * kHeads * kHeadDim)), v(k.size());
  for (std::int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < kHeads; ++h)
      for (int c = 0; c < kHeadDim; ++c) {
        const float smooth = std::sin(0.1f * static_cast<float>(t) + 0.5f * static_cast<float>(c + h));
        const float outlier = (t % 13 == 5) ? 3.0f : 0.0f;
        k[static_cast<std::size_t>((t * kHeads + h) * kHeadDim + c)] = bfloat16_t(smooth + outlier);
        v[static_cast<std::size_t>((t * kHeads + h) * kHeadDim + c)] = bfloat16_t(0.5f * smooth);
      }

  bfloat16_t *dk = nullptr, *dv = nullptr;
  std::int32_t *dindptr = nullptr, *dkept = nullptr, *dkept_indptr = nullptr;
  CHECK_CUDA(cudaMalloc(&dk, k.size() * sizeof(bfloat16_t)));
  CHECK_CUDA(cudaMalloc(&dv, v.size() * sizeof(bfloat16_t)));
  CHECK_CUDA(cudaMalloc(&dindptr, indptr.size() * sizeof(std::int32_t)));
  CHECK_CUDA(cudaMalloc(&dkept, static_cast<std::size_t>(kHeads * tokens) * sizeof(std::int32_t)));
  CHECK_CUDA(cudaMalloc(&dkept_indptr, 3 * sizeof(std::int32_t)));
  CHECK_CUDA(cudaMemcpy(dk, k.data(), k.size() * sizeof(bfloat16_t), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv, v.data(), v.size() * sizeof(bfloat16_t), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dindptr, indptr.data(), indptr.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));

  bfloat16_t* k_layers[1] = {dk};
  bfloat16_t* v_layers[1] = {dv};
  // [tokens][heads][d], two sequences packed in order (dindptr).
  const auto cache = fcc::Cache<bfloat16_t>::dense_nhd(1, k_layers, v_layers, kHeads, kHeadDim, tokens, 2, dindptr);

  flashcache::Options opt;
  opt.score.transform = flashcache::Transform::blocked;  // one fused pass, no cuFFT plan
  opt.score.base = flashcache::Base::lowpass;            // the blocked kernel builds the low-pass base
  opt.score.block_size = 32;
  opt.select.sink = 1;  // always keep each sequence's first token
  fcc::Outputs<bfloat16_t> out;
  out.kept = dkept;
  out.kept_indptr = dkept_indptr;
  const flashcache::Budget budget = flashcache::Budget::ratio(0.25);

  std::size_t bytes = 0;
  CHECK_STATUS(fcc::workspace_size(cache, opt, &bytes));
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, bytes));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreate(&stream));
  CHECK_STATUS(fcc::compress_async(cache, budget, opt, out, workspace, bytes, stream));
  CHECK_STATUS(fcc::device_status(cache, opt, workspace, stream));  // waits for the stream

  std::vector<std::int32_t> kept(static_cast<std::size_t>(kHeads * tokens)), kept_indptr(3);
  CHECK_CUDA(cudaMemcpy(kept.data(), dkept, kept.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(kept_indptr.data(), dkept_indptr, 3 * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
  std::printf("workspace: %zu bytes\n", bytes);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < kHeads; ++h) {
      std::printf("sequence %d (%d tokens), head %d keeps %d:", b, indptr[b + 1] - indptr[b], h,
                  kept_indptr[b + 1] - kept_indptr[b]);
      for (std::int32_t i = kept_indptr[b]; i < kept_indptr[b + 1]; ++i)
        std::printf(" %d", kept[static_cast<std::size_t>(h * tokens + i)]);
      std::printf("\n");
    }
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaFree(workspace));
  CHECK_CUDA(cudaFree(dk));
  CHECK_CUDA(cudaFree(dv));
  CHECK_CUDA(cudaFree(dindptr));
  CHECK_CUDA(cudaFree(dkept));
  CHECK_CUDA(cudaFree(dkept_indptr));
  return 0;
}
