// Checks shared by the subcommands: the library's own (check_options, one
// definition of each rule) with the command-line names in the messages.
#include <cctype>
#include <string>
#include <utility>

#include "cli_error.hpp"
#include "commands.hpp"

namespace flashcache::cli {

namespace {

// The Options fields that a flag sets, by the flag's name.
constexpr std::pair<const char*, const char*> kFieldFlags[] = {
    {"gamma", "--gamma"},
    {"block_size", "--block"},
    {"sink", "--sink"},
    {"window", "--window"},
    {"window_share", "--window-share"},
    {"base_share", "--base-share"},
    {"grid_base_share", "--grid-base-share"},
    {"grid_tile", "--grid-tile"},
    {"tail_weight", "--tail-weight"},
    {"mean_weight", "--mean-weight"},
    {"mean_full_keep", "--mean-full-keep"},
    {"mean_zero_keep", "--mean-zero-keep"},
    {"bridge", "--bridge"},
};

bool is_name_char(char c) { return std::islower(static_cast<unsigned char>(c)) || c == '_'; }

// `message` with each whole word that names a field replaced by its flag.
std::string in_flag_words(const std::string& message) {
  std::string out;
  for (std::size_t i = 0; i < message.size();) {
    if (!is_name_char(message[i])) {
      out += message[i++];
      continue;
    }
    std::size_t end = i;
    while (end < message.size() && is_name_char(message[end])) ++end;
    std::string word = message.substr(i, end - i);
    for (const auto& [field, flag] : kFieldFlags)
      if (word == field) {
        word = flag;
        break;
      }
    out += word;
    i = end;
  }
  return out;
}

}  // namespace

void check_options_as_flags(const Options& o) {
  if (const Status s = check_options(o); !s.ok()) usage_error(in_flag_words(s.message()));
}

void check_transform_args(const TransformArgs& t) { check_options_as_flags(to_options(t)); }

Options to_options(const TransformArgs& t) {
  Options o;
  o.score.gamma = t.gamma;
  o.score.transform = t.transform;
  o.score.block_size = t.block;
  o.score.base = t.base;
  return o;
}

}  // namespace flashcache::cli
