#pragma once
// The evaluations' results files (quality_eval, grid_eval, select_configs): the
// run's provenance, an existing results file read back so that the parts this
// run does not write are kept, and the JSON written out.
#include <flashcache/version.hpp>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace flashcache::quality {

// The standard output of a shell command, trailing newlines and blanks removed
// (empty when it cannot run): the git revision and machine in a record.
inline std::string run_text(const std::string& cmd) {
  std::string out;
  if (std::FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

inline std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// The start of every run's header: date, command line, the source tree's git
// revision and whether it has uncommitted changes, the library version. The
// caller adds what its run measured.
inline nlohmann::ordered_json provenance(int argc, char** argv, const std::string& source_dir) {
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  nlohmann::ordered_json h;
  h["date"] = utc_now();
  h["command"] = command;
  h["git_revision"] = run_text("git -C '" + source_dir + "' rev-parse HEAD 2>/dev/null");
  h["git_dirty"] = !run_text("git -C '" + source_dir + "' status --porcelain --untracked-files=no 2>/dev/null").empty();
  h["library"] = FLASHCACHE_VERSION_STRING;
  return h;
}

// The results file already at `path`, to keep what this run does not replace: an
// empty object when there is none, or it is not a JSON object.
inline nlohmann::ordered_json read_old_results(const std::string& path) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  if (std::ifstream old(path); old) {
    try {
      doc = nlohmann::ordered_json::parse(old);
    } catch (const std::exception&) {
      doc = nlohmann::ordered_json::object();
    }
    if (!doc.is_object()) doc = nlohmann::ordered_json::object();
  }
  return doc;
}

// The old file's "header" object (one header per part or split), or an empty one.
inline nlohmann::ordered_json old_headers(const nlohmann::ordered_json& doc) {
  return doc.contains("header") && doc["header"].is_object() ? doc["header"] : nlohmann::ordered_json::object();
}

// The old file's records that `keep` accepts, then `records`.
template <class Keep>
nlohmann::ordered_json merge_records(const nlohmann::ordered_json& doc, Keep keep,
                                     const nlohmann::ordered_json& records) {
  nlohmann::ordered_json merged = nlohmann::ordered_json::array();
  if (doc.contains("records"))
    for (const auto& r : doc["records"])
      if (keep(r)) merged.push_back(r);
  for (const auto& r : records) merged.push_back(r);
  return merged;
}

// `doc` as indented JSON (one space) into `path`, its folder made if missing.
template <class Json>
void write_json(const std::string& path, const Json& doc) {
  if (!std::filesystem::path(path).parent_path().empty())
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream o(path);
  o << doc.dump(1) << "\n";
  if (!o) throw std::runtime_error("cannot write " + path);
}

}  // namespace flashcache::quality
