// Outputs apart from inputs: comparing files by identity, not by spelling.
#include "autoaccum/core/distinct_paths.hpp"

#include <sys/stat.h>

#include <climits>
#include <cstdlib>
#include <filesystem>

#include "autoaccum/core/error.hpp"

namespace autoaccum::core {
namespace {

// The absolute path with every existing folder on the way resolved (links, "..", "."): the
// longest existing prefix through realpath, the rest appended lexically.
std::string resolved(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::path absolute = fs::absolute(fs::path(path), error);
  if (error) absolute = fs::path(path);
  absolute = absolute.lexically_normal();
  fs::path existing = absolute;
  fs::path rest;
  while (!existing.empty() && existing != existing.root_path()) {
    char buffer[PATH_MAX];
    if (::realpath(existing.c_str(), buffer)) return (fs::path(buffer) / rest).lexically_normal();
    rest = existing.filename() / rest;
    existing = existing.parent_path();
  }
  return absolute.string();
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {};
  struct stat sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return resolved(a) == resolved(b);
}

void check_outputs_apart(const std::vector<NamedPath>& inputs,
                         const std::vector<NamedPath>& outputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& out = outputs[i];
    if (out.path.empty()) continue;
    for (const NamedPath& in : inputs) {
      if (in.path.empty() || !same_file(out.path, in.path)) continue;
      throw UsageError(out.option + " '" + out.path + "' is the same file as " + in.option + " '" +
                       in.path + "': an output must not overwrite an input; nothing was written");
    }
    for (std::size_t j = 0; j < i; ++j) {
      const NamedPath& other = outputs[j];
      if (other.path.empty() || !same_file(out.path, other.path)) continue;
      throw UsageError(out.option + " '" + out.path + "' is the same file as " + other.option +
                       " '" + other.path +
                       "': two outputs would overwrite each other; nothing "
                       "was written");
    }
  }
}

}  // namespace autoaccum::core
