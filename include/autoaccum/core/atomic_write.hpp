// write_atomically: a file appears whole at its path or not at all.
#pragma once

#include <functional>
#include <string>

namespace autoaccum {

// Calls `write(temporary_path)` (a name beside `path`, on the same file system) and renames the
// result onto `path`. If `write` throws, the temporary is removed and `path` is untouched, so a
// failure never leaves a half-written file nor damages the file already there.
void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write);

// Throws UsageError naming `option` unless a file can be created at `path`: its folder exists and
// is writable, and `path` is not a folder. Checked before any work, so a typo costs seconds.
void check_writable_file(const std::string& option, const std::string& path);

}  // namespace autoaccum
