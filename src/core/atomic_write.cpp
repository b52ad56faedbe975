// write_atomically: temporary file + rename(2), which replaces the target atomically.
#include "autoaccum/core/atomic_write.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <dirent.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "autoaccum/core/error.hpp"

namespace autoaccum {
namespace {

std::string folder_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

}  // namespace

void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  try {
    write(temporary);
  } catch (const Error& e) {
    std::remove(temporary.c_str());
    // Name the file the user knows, not the temporary one.
    std::string message = e.what();
    for (auto at = message.find(temporary); at != std::string::npos; at = message.find(temporary)) {
      message.replace(at, temporary.size(), path);
    }
    throw Error(message, e.exit_code());
  } catch (...) {
    std::remove(temporary.c_str());
    throw;
  }
  // On disk before it gets the real name, so a node crash cannot leave a renamed but empty file.
  const int file = ::open(temporary.c_str(), O_RDONLY | O_CLOEXEC);
  if (file < 0 || ::fsync(file) != 0) {
    const std::string reason = std::strerror(errno);
    if (file >= 0) ::close(file);
    std::remove(temporary.c_str());
    throw InputError("cannot write '" + path + "': " + reason);
  }
  ::close(file);
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    throw InputError("cannot rename '" + temporary + "' to '" + path + "': " + reason);
  }
  // The rename is an update of the folder: on disk too before the file counts as written, so a
  // node crash right after cannot bring the old name back.
  const int folder = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (folder >= 0) {
    (void)::fsync(folder);  // best effort: some file systems refuse fsync on a folder
    ::close(folder);
  }
}

void write_file(const std::string& path, const void* data, std::size_t size) {
  const int file = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (file < 0) throw InputError("cannot write '" + path + "' (" + std::strerror(errno) + ")");
  const char* next = static_cast<const char*>(data);
  std::size_t left = size;
  while (left > 0) {
    const ssize_t written = ::write(file, next, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      const std::string reason = written < 0 ? std::strerror(errno) : "nothing written";
      ::close(file);
      throw InputError("cannot write '" + path + "' (" + reason + ")");
    }
    next += written;
    left -= static_cast<std::size_t>(written);
  }
  if (::close(file) != 0)
    throw InputError("cannot write '" + path + "' (" + std::strerror(errno) + ")");
}

void check_free_space(const std::string& path, std::uint64_t bytes) {
  // A file-size limit (ulimit -f) is a full disk for this file: reserved blocks would not lift
  // it, and the writes past it would fail inside HDF5.
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      bytes > limit.rlim_cur) {
    throw InputError("cannot write '" + path + "' (" + std::strerror(EFBIG) + ": " +
                     std::to_string(bytes) + " bytes needed, the file-size limit (ulimit -f) is " +
                     std::to_string(limit.rlim_cur) + ")");
  }
  struct statvfs space {};
  if (::statvfs(folder_of(path).c_str(), &space) != 0) return;
  const auto free = static_cast<std::uint64_t>(space.f_bavail) * space.f_frsize;
  if (free < bytes) {
    throw InputError("cannot write '" + path + "' (" + std::strerror(ENOSPC) + ": " +
                     std::to_string(bytes) + " bytes needed, " + std::to_string(free) + " free)");
  }
}

void reserve_space(const std::string& path, std::uint64_t bytes) {
  if (bytes == 0) return;
  const int file = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (file < 0) throw InputError("cannot write '" + path + "' (" + std::strerror(errno) + ")");
  int result = 0;
  do {
    result = ::fallocate(file, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes));
  } while (result != 0 && errno == EINTR);
  const int error = result == 0 ? 0 : errno;
  ::close(file);
  if (error == 0) return;
  if (error == ENOSPC || error == EDQUOT || error == EFBIG)
    throw InputError("cannot write '" + path + "' (" + std::strerror(error) + ")");
  check_free_space(path, bytes);  // EOPNOTSUPP and the like: the file system cannot reserve
}

std::int64_t release_reserve(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return 0;
  (void)::truncate(path.c_str(), info.st_size);
  return static_cast<std::int64_t>(info.st_size);
}

std::vector<std::string> remove_stale_temporaries(const std::string& path) {
  const std::string folder = folder_of(path);
  const auto slash = path.rfind('/');
  const std::string prefix = (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.";
  std::vector<std::string> removed;
  DIR* listing = ::opendir(folder.c_str());
  if (!listing) return removed;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string full = folder + "/" + name;
    if (std::remove(full.c_str()) == 0) removed.push_back(full);
  }
  ::closedir(listing);
  return removed;
}

void check_writable_file(const std::string& option, const std::string& path) {
  const std::string folder = folder_of(path);
  struct stat info {};
  if (stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    throw UsageError(option + ": '" + path + "' is a folder; give a file name");
  }
  if (stat(folder.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    throw UsageError(option + ": cannot write '" + path + "': folder '" + folder +
                     "' does not exist");
  }
  if (access(folder.c_str(), W_OK) != 0) {
    throw UsageError(option + ": cannot write '" + path + "': folder '" + folder +
                     "' is not writable");
  }
}

}  // namespace autoaccum
