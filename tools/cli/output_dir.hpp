#pragma once
// The output folder is never left half-written: everything goes into a hidden
// sibling folder, which commit() renames into place at the end. If the program
// fails before that, the sibling is removed and the target is untouched.
//
// An existing target is used only if it is an empty directory, or with
// `force`, in which case it is replaced as a whole (swapped atomically where
// the file system can, else moved aside first).
//
// A run killed before it could clean up (SIGKILL) leaves its hidden sibling
// behind; the next run on the same target deletes those of dead processes, and
// puts back a target that a killed --force run had moved aside.
#include <filesystem>
#include <string>

namespace flashcache::cli {

class StagedDir {
 public:
  // Refuses (usage error) a target that cannot be written or would need
  // `force`. Cheap: call it before doing any work.
  static void check_target(const std::filesystem::path& target, bool force);

  // Creates missing parents of the target and the staging folder.
  StagedDir(const std::filesystem::path& target, bool force);
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  // Where to write the files until commit().
  const std::filesystem::path& path() const { return staging_; }
  // Moves the staging folder to the target.
  void commit();

 private:
  std::filesystem::path target_, staging_;
  bool force_;
  bool committed_ = false;
};

// Writes `text` to `path`, reporting any failure (full disk included).
void write_text_file(const std::filesystem::path& path, const std::string& text);

}  // namespace flashcache::cli
