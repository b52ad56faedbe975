// write_atomically: temporary file + rename(2), which replaces the target atomically.
#include "autoaccum/core/atomic_write.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "autoaccum/core/error.hpp"

namespace autoaccum {

void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  try {
    write(temporary);
  } catch (...) {
    std::remove(temporary.c_str());
    throw;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    throw InputError("cannot rename '" + temporary + "' to '" + path + "': " + reason);
  }
}

}  // namespace autoaccum
