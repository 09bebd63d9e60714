#pragma once
// Stage 1, Transform::global (flashcache/cuda/kernels/score_global.cuh,
// score_global_base.cuh): per sequence and layer, pack, cuFFT forward, the base (low-pass, or chosen by
// energy), cuFFT inverse, residuals.
#include <cufft.h>

#include "flashcache/cuda/global_transform.cuh"
#include "flashcache/cuda/kernels/score_global.cuh"
#include "flashcache/cuda/kernels/score_global_base.cuh"
#include "flashcache/cuda/run_context.cuh"

namespace flashcache::gpu::detail {

static_assert(kGlobalSlotTokens == kernels::kGlobalTile, "the workspace's global slots are the residual pass's tiles");

// A base chosen by energy (ScoreOptions::base peak, mixed) for the spectra of one
// (layer, sequence) of n > 1 tokens, after the forward FFT: energies, the
// choice per (head, K | V), the base's coefficients kept in place.
template <class T>
Status choose_base(const RunContext<T>& run, std::int64_t n, cudaStream_t stream) {
  const Cache<T>& c = run.cache;
  const Workspace& ws = run.ws;
  auto* z = static_cast<float2*>(ws.spectrum());
  const unsigned pair_ctas = static_cast<unsigned>(kernels::ceil_div(n / 2 + 1, 256));
  kernels::BaseEnergyParams e;
  e.z = z;
  e.n = n;
  e.head_dim = static_cast<int>(c.head_dim);
  e.energy = ws.base_energy();
  e.status = run.status;
  kernels::base_energy_kernel<>
      <<<dim3(pair_ctas, static_cast<unsigned>(c.heads)), kernels::kBaseEnergyThreads, 0, stream>>>(e);
  FLASHCACHE_RETURN_IF_ERROR(launched("base_energy_kernel"));
  kernels::BaseChooseParams choose;
  choose.energy = ws.base_energy();
  choose.chosen = ws.base_chosen();
  choose.n = n;
  choose.m = lowpass_cutoff(n, run.opt.score.gamma);
  choose.kind = run.opt.score.base;
  choose.status = run.status;
  kernels::base_choose_kernel<>
      <<<dim3(static_cast<unsigned>(c.heads), 2), kernels::kBaseChooseThreads, 0, stream>>>(choose);
  FLASHCACHE_RETURN_IF_ERROR(launched("base_choose_kernel"));
  kernels::ChosenBaseParams keep;
  keep.z = z;
  keep.n = n;
  keep.heads = static_cast<int>(c.heads);
  keep.head_dim = static_cast<int>(c.head_dim);
  keep.chosen = ws.base_chosen();
  keep.status = run.status;
  kernels::chosen_base_kernel<><<<dim3(pair_ctas, static_cast<unsigned>(c.heads * c.head_dim)), 256, 0, stream>>>(keep);
  return launched("chosen_base_kernel");
}

// The transform's lengths against the device's, every sequence, before anything uses them.
template <class T>
Status check_lengths(const RunContext<T>& run, const GlobalTransform& global, cudaStream_t stream) {
  const int sequences = run.cache.sequences;
  for (int first = 0; first < sequences; first += kernels::kLengthsPerCheck) {
    kernels::LengthCheckParams check{};
    check.seq_len = run.layers.seq.len;
    check.first = first;
    check.count = sequences - first < kernels::kLengthsPerCheck ? sequences - first : kernels::kLengthsPerCheck;
    for (int i = 0; i < check.count; ++i)
      check.expected[i] = static_cast<std::int32_t>(global.lengths()[static_cast<std::size_t>(first + i)]);
    check.status = run.status;
    kernels::check_lengths_kernel<><<<1, kernels::kLengthsPerCheck, 0, stream>>>(check);
    FLASHCACHE_RETURN_IF_ERROR(launched("check_lengths_kernel"));
  }
  return Status::success();
}

// Non-finite rows: marked, then each given its finite stand-in row.
template <class T>
Status substitute_rows(const RunContext<T>& run, cudaStream_t stream) {
  const Cache<T>& c = run.cache;
  kernels::SubstituteParams<T> p{};
  run.set_layer_rows(&p);
  p.vector_ok = run.vector_ok;
  p.capacity = c.capacity;
  p.sub = run.ws.substitutes();
  p.status = run.status;
  if (c.capacity > 0) {
    kernels::finite_kernel<T><<<dim3(static_cast<unsigned>(kernels::ceil_div(c.capacity, kernels::kFiniteRowsPerCta)),
                                     static_cast<unsigned>(c.heads), static_cast<unsigned>(c.layers)),
                                kernels::kFiniteThreads, 0, stream>>>(p);
    FLASHCACHE_RETURN_IF_ERROR(launched("finite_kernel"));
  }
  kernels::substitute_kernel<T>
      <<<dim3(static_cast<unsigned>(c.sequences), static_cast<unsigned>(c.heads), static_cast<unsigned>(c.layers)),
         kernels::kSubstituteThreads, 0, stream>>>(p);
  return launched("substitute_kernel");
}

// One layer of sequence b (n tokens): pack, base, residuals.
template <class T>
Status score_global_layer(const RunContext<T>& run, int b, int l, std::int64_t n, const GlobalTransform& global,
                          cudaStream_t stream) {
  const Cache<T>& c = run.cache;
  const Options& opt = run.opt;
  const Workspace& ws = run.ws;
  const std::int64_t columns = c.heads * c.head_dim;
  auto* z = static_cast<float2*>(ws.spectrum());
  auto* zc = static_cast<cufftComplex*>(ws.spectrum());
  const std::int32_t* sub = ws.substitutes() + static_cast<std::int64_t>(l) * c.heads * c.capacity;
  kernels::PackParams<T> pack{};
  pack.k = c.k[l];
  pack.v = c.v[l];
  pack.rows = run.layers.rows;
  pack.sequence = b;
  pack.heads = static_cast<int>(c.heads);
  pack.head_dim = static_cast<int>(c.head_dim);
  pack.n = n;
  pack.sub = sub;
  pack.capacity = c.capacity;
  pack.seq = run.layers.seq;
  pack.z = z;
  pack.status = run.status;
  kernels::pack_kernel<T>
      <<<dim3(static_cast<unsigned>(kernels::ceil_div(n, 32)), static_cast<unsigned>(kernels::ceil_div(columns, 32))),
         dim3(32, 8), 0, stream>>>(pack);
  FLASHCACHE_RETURN_IF_ERROR(launched("pack_kernel"));
  // One token: the DCT, the low-pass (m = 1) and the inverse are the identity,
  // so pack feeds the residual pass directly and cuFFT is not involved.
  if (n > 1) {
    FLASHCACHE_RETURN_IF_ERROR(global.execute(n, zc, /*inverse=*/false));
    const unsigned pair_ctas = static_cast<unsigned>(kernels::ceil_div(n / 2 + 1, 256));
    if (opt.score.base == Base::lowpass) {  // the paper's: frequencies k < m
      kernels::LowpassParams lp;
      lp.z = z;
      lp.n = n;
      lp.m = lowpass_cutoff(n, opt.score.gamma);
      lp.status = run.status;
      kernels::lowpass_kernel<><<<dim3(pair_ctas, static_cast<unsigned>(columns)), 256, 0, stream>>>(lp);
      FLASHCACHE_RETURN_IF_ERROR(launched("lowpass_kernel"));
    } else {  // chosen by energy, per head, K and V each their own (score_global.cuh)
      FLASHCACHE_RETURN_IF_ERROR(choose_base(run, n, stream));
    }
    FLASHCACHE_RETURN_IF_ERROR(global.execute(n, zc, /*inverse=*/true));
  }
  kernels::ResidualParams<T> rp{};
  rp.k = c.k[l];
  rp.v = c.v[l];
  rp.rows = run.layers.rows;
  rp.seq = run.layers.seq;
  rp.sequence = b;
  rp.layer = l;
  rp.heads = static_cast<int>(c.heads);
  rp.head_dim = static_cast<int>(c.head_dim);
  rp.n = n;
  rp.capacity = c.capacity;
  rp.slot_count = ws.layout().slot_count;
  rp.protect = run.protect;
  rp.grids = run.grids;
  rp.sub = sub;
  rp.z = z;
  rp.scores = ws.scores();
  rp.energy_part = static_cast<float4*>(ws.energy_part());
  rp.protected_part = ws.protected_part();
  rp.status = run.status;
  kernels::residual_kernel<T>
      <<<dim3(static_cast<unsigned>(kernels::ceil_div(n, kernels::kGlobalTile)), static_cast<unsigned>(c.heads)), 256,
         0, stream>>>(rp);
  return launched("residual_kernel");
}

template <class T>
Status score_global(const RunContext<T>& run, const GlobalTransform& global, cudaStream_t stream) {
  FLASHCACHE_RETURN_IF_ERROR(check_lengths(run, global, stream));
  FLASHCACHE_RETURN_IF_ERROR(substitute_rows(run, stream));
  // Packed offsets come from the device (seq.offset), never from the transform:
  // the transform only says how long each transform is, and check_lengths stops
  // the run if that differs from what the device found.
  for (int b = 0; b < run.cache.sequences; ++b) {
    const std::int64_t n = global.lengths()[static_cast<std::size_t>(b)];
    if (n == 0) continue;  // compared on the device above; nothing to transform
    for (int l = 0; l < run.cache.layers; ++l)
      FLASHCACHE_RETURN_IF_ERROR(score_global_layer(run, b, l, n, global, stream));
  }
  return Status::success();
}

}  // namespace flashcache::gpu::detail
