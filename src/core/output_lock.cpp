// OutputLock: flock on a lock file beside the output, holder written inside.
#include "autoaccum/core/output_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "autoaccum/core/error.hpp"

namespace autoaccum {
namespace {

std::string read_all(int fd) {
  std::string text;
  char chunk[256];
  lseek(fd, 0, SEEK_SET);
  for (;;) {
    const ssize_t n = read(fd, chunk, sizeof chunk);
    if (n <= 0) break;
    text.append(chunk, static_cast<std::size_t>(n));
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.pop_back();
  return text;
}

std::string this_holder() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return "host " + std::string(host) + ", pid " + std::to_string(getpid());
}

}  // namespace

OutputLock::OutputLock(const std::string& option, const std::string& path)
    : lock_path_(lock_path(path)) {
  // The path may be replaced between open and flock by a holder that is finishing (it removes
  // its lock file): retry until the locked file is the one at the path.
  for (int tries = 0; tries < 100; ++tries) {
    fd_ = open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw UsageError(option + ": cannot create the lock file '" + lock_path_ +
                       "': " + std::strerror(errno));
    }
    if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      const std::string holder = read_all(fd_);
      close(fd_);
      fd_ = -1;
      if (error == EWOULDBLOCK) {
        throw UsageError(option + ": '" + path + "' is in use by another job (" +
                         (holder.empty() ? std::string("holder unknown") : holder) +
                         "; lock file " + lock_path_ + ")");
      }
      throw UsageError(option + ": cannot lock '" + lock_path_ + "': " + std::strerror(error));
    }
    struct stat held {
    }, now{};
    if (fstat(fd_, &held) == 0 && stat(lock_path_.c_str(), &now) == 0 &&
        held.st_ino == now.st_ino && held.st_dev == now.st_dev) {
      break;
    }
    close(fd_);  // removed or replaced meanwhile: lock the one there now
    fd_ = -1;
  }
  if (fd_ < 0) throw UsageError(option + ": cannot lock '" + lock_path_ + "'");
  const std::string previous = read_all(fd_);
  if (!previous.empty()) {
    warning_ = option + ": took over '" + path + "' from a job that is gone (" + previous + ")";
  }
  const std::string holder = this_holder() + "\n";
  if (ftruncate(fd_, 0) != 0 || pwrite(fd_, holder.data(), holder.size(), 0) < 0) {
    // The lock holds without the note; a refused job then says "holder unknown".
  }
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  unlink(lock_path_.c_str());  // before unlocking: a waiter then re-opens a fresh file
  close(fd_);
}

}  // namespace autoaccum
