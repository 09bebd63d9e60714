#pragma once
// -log p(token) under one row of logits: the NLL both llama.cpp measuring programs
// report (flashcache_llama's continuation, flashcache_chat's stream), one definition.
#include <algorithm>
#include <cmath>

namespace token_nll {

// A log-sum-exp in double over the row shifted by its largest logit.
inline double of(const float* logits, int n_vocab, int token) {
  const float mx = *std::max_element(logits, logits + n_vocab);
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  return std::log(sum) - static_cast<double>(logits[token] - mx);
}

}  // namespace token_nll
