// One message line written in one piece.
//
// Under mpirun each rank's stdout and stderr reach the terminal through the launcher, which
// forwards whatever each write() delivered; a line assembled from several `<<` on an unbuffered
// std::cerr is several writes, and a launcher tearing the job down after another rank's non-zero
// exit has been seen to forward only some of them (Open MPI 5). Errors and warnings go through
// write_line: the whole line, newline included, in one write, then flushed.
#pragma once

#include <cstdio>
#include <string>

namespace autoaccum::core {

inline void write_line(std::FILE* stream, std::string line) {
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stream);
  std::fflush(stream);
}

}  // namespace autoaccum::core
