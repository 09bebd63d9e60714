#pragma once
// FLASHCACHE_GPU_SIM builds only (bench/gpu_sim_check.sh): the global transform's
// FFTs on the host. GPGPU-Sim cannot run cuFFT (cufftCreate talks to the driver),
// yet the global transform is the default path, so a simulator build lets the CPU
// library's FFT (score/fft.hpp, checked against the naive DFT) stand in for the two
// cufftExecC2C calls, and every kernel around them (pack, the base, residuals,
// energies, image spans, selection) runs in the simulator. It waits for the
// stream and copies through host memory: a way to check results, never to run
// fast, and not capturable in a CUDA graph.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "flashcache/cuda/status.cuh"
#include "flashcache/error.hpp"
#include "flashcache/score/fft.hpp"

namespace flashcache::gpu::detail {

// cuFFT's C2C over `columns` contiguous columns of n points each, in place:
// forward X[k] = sum_j x[j] e^(-2 pi i jk/n), inverse with e^(+...), both unscaled.
inline Status host_fft_columns(float2* z, std::int64_t n, std::int64_t columns, bool inverse, cudaStream_t stream) {
  const auto count = static_cast<std::size_t>(n * columns);
  std::vector<float2> host(count);
  FLASHCACHE_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "simulator FFT stand-in: cudaStreamSynchronize"));
  FLASHCACHE_RETURN_IF_ERROR(
      cuda_status(cudaMemcpy(host.data(), z, count * sizeof(float2), cudaMemcpyDeviceToHost), "simulator FFT stand-in: cudaMemcpy"));
  PanelFft<double, 1> fft(n);
  std::vector<double> re(static_cast<std::size_t>(n)), im(re.size());
  for (std::int64_t c = 0; c < columns; ++c) {
    float2* column = host.data() + c * n;
    for (std::int64_t j = 0; j < n; ++j) {
      re[static_cast<std::size_t>(j)] = column[j].x;
      im[static_cast<std::size_t>(j)] = column[j].y;
    }
    if (inverse)
      fft.inverse(re.data(), im.data());
    else
      fft.forward(re.data(), im.data());
    for (std::int64_t j = 0; j < n; ++j)
      column[j] = make_float2(static_cast<float>(re[static_cast<std::size_t>(j)]),
                              static_cast<float>(im[static_cast<std::size_t>(j)]));
  }
  return cuda_status(cudaMemcpy(z, host.data(), count * sizeof(float2), cudaMemcpyHostToDevice),
                     "simulator FFT stand-in: cudaMemcpy");
}

}  // namespace flashcache::gpu::detail
