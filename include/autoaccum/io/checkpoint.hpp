// HDF5 checkpoints: parameters, buffers, optimizer state and where the run stood.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace autoaccum::io {

struct Checkpoint {
  std::int64_t step = 0;         // optimizer steps completed
  std::int64_t epoch = 0;        // epoch of the next step
  std::int64_t micro_batch = 0;  // the micro-batch size in use
  std::int64_t world_size = 1;
  std::uint64_t seed = 0;
  std::vector<std::pair<std::string, at::Tensor>> params;   // params/<name>
  std::vector<std::pair<std::string, at::Tensor>> buffers;  // buffers/<name>
  std::string optimizer;  // LibTorch's serialized optimizer state, at optimizer/state
};

// Written under a temporary name and renamed onto `path`: a crash leaves the previous
// checkpoint whole.
void write_checkpoint(const std::string& path, const Checkpoint& checkpoint);
// InputError names the file when it is missing, truncated or not an autoaccum checkpoint.
Checkpoint read_checkpoint(const std::string& path);

}  // namespace autoaccum::io
