// OutputLock: one job at a time writes a given run log or checkpoint.
#pragma once

#include <string>

namespace autoaccum {

// Holds `path + ".lock"` with flock(2) for the lock's lifetime; the file records the holder's
// host and pid. A second job that names the same output is refused with a UsageError naming
// `option`, the path and the holder. A lock file left by a job that died (no flock holds it:
// the kernel drops a dead process's locks) is taken over, and warning() says so.
class OutputLock {
 public:
  OutputLock(const std::string& option, const std::string& path);
  ~OutputLock();  // removes the lock file
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  const std::string& warning() const noexcept { return warning_; }
  static std::string lock_path(const std::string& path) { return path + ".lock"; }

 private:
  std::string lock_path_;
  int fd_ = -1;
  std::string warning_;
};

}  // namespace autoaccum
