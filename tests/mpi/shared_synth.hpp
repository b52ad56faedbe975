// For MPI tests: a folder that rank 0 makes (its name broadcast to every rank) holding one
// synthetic training file; rank 0 removes it, after a barrier, when the object goes.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "autoaccum/comm/communicator.hpp"
#include "autoaccum/data/importers.hpp"

namespace autoaccum::test_support {

class SharedSynthFile {
 public:
  SharedSynthFile(comm::Communicator& world, data::SynthOptions options) : world_(world) {
    if (world.rank() == 0) {
      char name[] = "/tmp/autoaccum-test-XXXXXX";
      if (!mkdtemp(name)) throw std::runtime_error("mkdtemp failed");
      dir_ = name;
      options.out = dir_ + "/synth.h5";
      data::write_synthetic(options);
    }
    world.broadcast(dir_, 0);
  }
  ~SharedSynthFile() {
    world_.barrier();
    if (world_.rank() == 0) (void)std::system(("rm -rf " + dir_).c_str());
  }
  SharedSynthFile(const SharedSynthFile&) = delete;
  SharedSynthFile& operator=(const SharedSynthFile&) = delete;

  const std::string& dir() const noexcept { return dir_; }
  std::string path() const { return dir_ + "/synth.h5"; }

 private:
  comm::Communicator& world_;
  std::string dir_;
};

}  // namespace autoaccum::test_support
