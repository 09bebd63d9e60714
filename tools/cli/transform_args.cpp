// Checks shared by the subcommands, with the command-line names in the messages
// (the library's own checks would name the Options fields instead).
#include "cli_error.hpp"
#include "commands.hpp"

namespace flashcache::cli {

void check_transform_args(const TransformArgs& t) {
  if (!(t.gamma > 0.0 && t.gamma <= 1.0)) usage_error("--gamma " + num(t.gamma) + " is outside (0, 1]");
  if (t.block < 1) usage_error("--block " + std::to_string(t.block) + " must be at least 1");
}

Options to_options(const TransformArgs& t) {
  Options o;
  o.score.gamma = t.gamma;
  o.score.transform = t.transform;
  o.score.block_size = t.block;
  o.score.base = t.base;
  return o;
}

}  // namespace flashcache::cli
