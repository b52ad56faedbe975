// The optimizer's state in a checkpoint, per parameter and element, whichever rank holds which
// slice of it (private to src/train).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"
#include "autoaccum/io/checkpoint.hpp"
#include "autoaccum/train/reduce/reducer.hpp"
#include "autoaccum/train/step/optimizer_step.hpp"

namespace autoaccum::train {

// A checkpoint holds optimizer/<kind>/<parameter> as whole tensors of the parameter's shape,
// the same file whether the run was sharded or not, and on how many ranks. Without sharding
// rank 0 writes its own state. With --shard optimizer each piece (one owner's part of one
// parameter's state, at most 64 MiB) is broadcast by its owner while rank 0 writes: every rank
// makes the same broadcasts in the same order, and no rank holds more than its slice and one
// piece. On resume each rank reads only its slice (or everything, unsharded) from the file,
// straight into its state (through one host piece when the state is on a GPU).
class OptimizerCheckpoint {
 public:
  // `trainable` in the optimizer's (and the shard layout's) order, with their names.
  OptimizerCheckpoint(comm::Communicator& comm, OptimizerStep& optimizer, const Reducer& reducer,
                      const std::vector<at::Tensor>& trainable,
                      const std::vector<std::string>& names);

  // Rank 0: the datasets to write, filled as the writer asks for them.
  std::vector<io::Checkpoint::StreamedTensor> tensors();
  // Every rank, once rank 0 has written (or failed): the broadcasts still to make. Rank 0
  // calls it after the writer returns or throws; the others call it instead of writing. Ready
  // for the next checkpoint after it.
  void finish_exchange();
  // This rank's state from a checkpoint's: "" when it matched, else what does not match (for
  // the one-line error every rank agrees on).
  std::string load(const io::Checkpoint& c);

 private:
  struct Piece {
    std::size_t kind, parameter;
    int owner;
    std::int64_t offset, count;  // in the flat parameter space
  };
  void take(const Piece& piece, std::vector<float>& host);

  comm::Communicator& comm_;
  OptimizerStep& optimizer_;
  const ShardLayout* shards_;
  std::vector<at::Tensor> trainable_;
  std::vector<std::string> names_;
  std::vector<std::string> kinds_;
  std::vector<Piece> pieces_;  // sharded: every piece, in the order the file lists them
  std::size_t next_ = 0;
};

// The trainable parameters' names (a tied tensor's first name), in the order of `trainable`.
std::vector<std::string> trainable_names(
    const std::vector<std::pair<std::string, at::Tensor>>& named,
    const std::vector<at::Tensor>& trainable);

}  // namespace autoaccum::train
