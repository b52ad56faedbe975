// The checkpoint files beside `--checkpoint`: the older ones kept under their step's name, the
// rotation that keeps the newest N, and the order --resume tries them in.
#include "checkpoint_files.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "autoaccum/core/error.hpp"
#include "autoaccum/hdf5/hdf5.hpp"
#include "autoaccum/io/checkpoint.hpp"

namespace autoaccum::io {

namespace {

// "c.h5" -> ("c", ".h5"); "c" -> ("c", "").
std::pair<std::string, std::string> stem_and_suffix(const std::string& path) {
  constexpr const char* kSuffix = ".h5";
  const auto slash = path.find_last_of('/');
  const std::size_t name_at = slash == std::string::npos ? 0 : slash + 1;
  if (path.size() > name_at + 3 && path.compare(path.size() - 3, 3, kSuffix) == 0)
    return {path.substr(0, path.size() - 3), kSuffix};
  return {path, ""};
}

// The step in an older checkpoint's name, or -1 when `name` is not one of `path`'s.
std::int64_t step_in_name(const std::string& path, const std::string& candidate) {
  const auto [stem, suffix] = stem_and_suffix(path);
  const std::string head = stem + ".step";
  if (candidate.size() <= head.size() + suffix.size() || candidate.compare(0, head.size(), head))
    return -1;
  if (candidate.compare(candidate.size() - suffix.size(), suffix.size(), suffix)) return -1;
  const std::string digits =
      candidate.substr(head.size(), candidate.size() - head.size() - suffix.size());
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    return -1;
  return std::stoll(digits);
}

// The checkpoint steps of older files beside `path` (newest first).
std::vector<std::pair<std::int64_t, std::string>> older_by_step(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string prefix = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  std::vector<std::pair<std::int64_t, std::string>> found;
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return found;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string candidate = prefix + entry->d_name;
    const std::int64_t step = step_in_name(path, candidate);
    if (step >= 0) found.emplace_back(step, candidate);
  }
  ::closedir(dir);
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  return found;
}

// The step of the checkpoint at `path`; nothing when it is another kind of file. A file HDF5
// cannot read throws.
std::optional<std::int64_t> step_of(const std::string& path) {
  const auto file = hdf5::File::open(path);
  if (!file.has_attribute("format") || file.read_string_attribute("format") != kCheckpointFormat)
    return std::nullopt;
  return file.read_int_attribute("step");
}

}  // namespace

void keep_current(const std::string& path) {
  if (::access(path.c_str(), F_OK) != 0) return;
  std::optional<std::int64_t> step;
  try {
    step = step_of(path);
  } catch (const std::exception&) {
    // Unreadable (damaged, or written by something else): moved aside, as --resume moves a
    // damaged checkpoint, rather than replaced unseen by the new one.
    const std::string aside = path + ".damaged";
    if (std::rename(path.c_str(), aside.c_str()) != 0)
      throw InputError("'" + path + "' is not a readable checkpoint and cannot be moved to '" +
                       aside + "' (" + std::strerror(errno) + ")");
    return;
  }
  if (!step) return;
  const std::string older = older_checkpoint_path(path, *step);
  const std::string staged = path + ".tmp.older." + std::to_string(::getpid());
  std::remove(staged.c_str());
  const bool linked = ::link(path.c_str(), staged.c_str()) == 0;
  if (linked ? std::rename(staged.c_str(), older.c_str()) != 0
             : std::rename(path.c_str(), older.c_str()) != 0) {
    if (linked) std::remove(staged.c_str());
    throw InputError("cannot keep the previous checkpoint as '" + older + "' (" +
                     std::strerror(errno) + ")");
  }
}

void remove_beyond(const std::string& path, int keep) {
  const auto older = older_by_step(path);
  for (std::size_t i = static_cast<std::size_t>(std::max(keep - 1, 0)); i < older.size(); ++i)
    std::remove(older[i].second.c_str());
  std::remove((path + ".prev").c_str());
}

std::string older_checkpoint_path(const std::string& path, std::int64_t step) {
  const auto [stem, suffix] = stem_and_suffix(path);
  return stem + ".step" + std::to_string(step) + suffix;
}

std::vector<std::string> older_checkpoints(const std::string& path) {
  std::vector<std::string> paths;
  for (const auto& [step, older] : older_by_step(path))
    paths.push_back(older);
  if (::access((path + ".prev").c_str(), F_OK) == 0) paths.push_back(path + ".prev");
  return paths;
}

}  // namespace autoaccum::io
