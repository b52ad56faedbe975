// write_atomically: a file appears whole at its path or not at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace autoaccum {

// Calls `write(temporary_path)` (a name beside `path`, on the same file system) and renames the
// result onto `path`, fsyncing the file before and its folder after the rename. If `write` throws,
// the temporary is removed and `path` is untouched, so a failure never leaves a half-written file
// nor damages the file already there.
void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write);

// Writes `size` bytes to a new file at `path` (truncating one there); a failure (a full disk, a
// quota) is an InputError naming `path` and the reason. Meant for the `write` of
// write_atomically.
void write_file(const std::string& path, const void* data, std::size_t size);

// Makes room for `bytes` in the file at `path` (just created, still empty or nearly): with
// fallocate(2) and FALLOC_FL_KEEP_SIZE the file system sets the blocks aside, so writes within
// them cannot meet a full disk; where it cannot (no fallocate), the free space is checked
// instead. A full disk or quota is an InputError "cannot write 'path' (reason)".
void reserve_space(const std::string& path, std::uint64_t bytes);
// Gives back what reserve_space set aside beyond the end of the file at `path` (truncate(2) to
// its own size drops blocks past the end; best effort). Returns the file's size.
std::int64_t release_reserve(const std::string& path);
// Throws the same InputError when the file system that holds `path`'s folder has fewer than
// `bytes` free for an unprivileged writer (statvfs; silent when it cannot tell), or when
// `bytes` is past the file-size limit (ulimit -f).
void check_free_space(const std::string& path, std::uint64_t bytes);

// Removes the temporaries a killed writer left beside `path` (`path.tmp.<pid>`) and returns their
// names. Call it only while holding the output's lock (OutputLock): then no live writer exists.
std::vector<std::string> remove_stale_temporaries(const std::string& path);

// Throws UsageError naming `option` unless a file can be created at `path`: its folder exists and
// is writable, and `path` is not a folder. Checked before any work, so a typo costs seconds.
void check_writable_file(const std::string& option, const std::string& path);

}  // namespace autoaccum
