// HDF5 checkpoints: parameters, buffers, optimizer state and where the run stood.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autoaccum/core/error.hpp"

namespace autoaccum::io {

// What decides which rows each step reads: with the same record, a resumed run reads exactly
// the rows the interrupted one would have. global_batch 0: not recorded (an older checkpoint).
struct DataOrder {
  std::int64_t global_batch = 0;  // attribute data_global_batch
  // data_global_batch_tokens: document batches cut by tokens (--global-batch-tokens); 0: none.
  std::int64_t global_batch_tokens = 0;
  std::string shuffle;              // data_shuffle: "batch" or "none"
  std::int64_t rows = 0;            // data_rows: over every shard
  std::vector<std::string> files;   // data_files: the shards' file names (no folders)
  std::string fingerprint;          // data_fingerprint: a hash of the data's shape and rows
  std::int64_t batch_in_epoch = 0;  // data_batch_in_epoch: the next step's batch in its epoch
};

// Takes bytes in order and returns how many it took (fewer: the write failed).
using ByteSink = std::function<std::size_t(const void*, std::size_t)>;

struct Checkpoint {
  std::int64_t step = 0;         // optimizer steps completed
  std::int64_t epoch = 0;        // epoch of the next step
  std::int64_t micro_batch = 0;  // the micro-batch size in use (rank 0's)
  // Every rank's micro-batch (they differ under --micro-batch-scope rank), at micro_batches;
  // empty in checkpoints written before autoaccum saved them.
  std::vector<std::int64_t> micro_batches;
  // Every rank's rows of the global batch at the next step and at the one after (--balance
  // changes apply a step late), at shares and shares_after; empty: the even split.
  std::vector<std::int64_t> shares;
  std::vector<std::int64_t> shares_after;
  // The rows per rank the automatic micro-batches last followed (--balance with rows), at
  // shares_followed: the step before's when the shares change at the next step, so a resumed
  // run follows that change as the interrupted run would have; empty in older checkpoints.
  std::vector<std::int64_t> shares_followed;
  std::int64_t world_size = 1;
  std::uint64_t seed = 0;
  DataOrder data;
  // --precision fp16's loss scale and its clean steps towards growth; 0: none (attributes
  // loss_scale, loss_scale_clean_steps).
  double loss_scale = 0;
  std::int64_t loss_scale_clean_steps = 0;
  // params/<name>, buffers/<name>: on the CPU or a GPU; written from where they are.
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  // The optimizer's state, per parameter and element (autoaccum writes it so since sharding:
  // the same file whichever rank held which slice): optimizer/<kind>/<parameter name>, float32
  // tensors of the parameter's shape (kinds: momentum_buffer for SGD with momentum, exp_avg and
  // exp_avg_sq for AdamW), listed in the root attribute optimizer_names ("exp_avg/fc.weight"),
  // with optimizer_kind ("sgd", "adamw") and optimizer_step (AdamW's steps taken).
  std::string optimizer_kind;
  std::int64_t optimizer_step = 0;
  // Read back: each optimizer tensor ("kind/name") verified when the file was read, but left in
  // it: `read(first, count, out)` copies float32 elements [first, first + count) of the
  // flattened tensor into `out`, reading only the rows that hold them, so a rank takes its
  // slice (or, unsharded, the whole state in pieces) without a second copy of the whole. The
  // file stays open while one of them is held.
  struct StoredTensor {
    std::string name;
    std::vector<std::int64_t> shape;
    std::int64_t numel() const;
    std::function<void(std::int64_t first, std::int64_t count, float* out)> read;
  };
  std::vector<StoredTensor> optimizer_state;
  // Read back with Parameters::kInFile: the float32 parameters left in the file as the optimizer
  // state is (named without "params/") instead of in `params`, for the resuming trainer to read
  // into the model's own tensors: a resume holds no second copy of the model.
  std::vector<StoredTensor> stored_params;
  // For writing: float32 tensors given in pieces as they come (from the ranks that own them
  // under --shard optimizer), never whole in memory. `fill` calls `piece` with the elements in
  // order, in pieces of any size, once.
  using PieceSink = std::function<void(const float* data, std::int64_t count)>;
  struct StreamedTensor {
    std::string name;  // under optimizer/: "exp_avg/fc.weight"
    std::vector<std::int64_t> shape;
    std::function<void(const PieceSink&)> fill;
  };
  std::vector<StreamedTensor> streamed_optimizer;
  // LibTorch's serialized optimizer state at optimizer/state: what autoaccum wrote before the
  // per-parameter state (read back from such files; written only when set).
  std::string optimizer;
  // For writing, instead of `optimizer`: gives the same bytes to a sink as they are made, so
  // they are never held whole. Called twice (to measure, then to write): the same bytes each
  // time.
  std::function<void(const ByteSink&)> stream_optimizer;
  // Each rank's random-number generator state (opaque bytes), at rng/rank<R>; empty in
  // checkpoints written before autoaccum saved them.
  std::vector<std::string> generator_states;
  // Each rank's memory model (--micro-batch-search predict), so a resumed run predicts and cuts
  // documents as the interrupted one would have: memory_model/points, rows of (rank, units,
  // square, peak bytes); memory_model/ranks, a row per rank of (smallest size that ran out,
  // base bytes, documents' width-cost ratio). Empty: none recorded (older checkpoints, fixed
  // micro-batches).
  struct MemoryModelRecord {
    std::vector<double> points;  // (units, square, peak) per point
    double failed_units = 0;
    double base = 0;
    double width_ratio = 0;
  };
  std::vector<MemoryModelRecord> memory_models;
  // Documents, --micro-batch-cost auto: each rank's time fit (train::TimeFit), so a resumed run
  // cuts as the interrupted one would have: time_model/ranks, a row per rank of (fixed, per padded
  // token, per row x width^2) seconds, -1 in all three for a rank without one. Empty: none. (The
  // checkpoints of schema 13's runs kept (fixed in padded tokens, seconds per padded token) as
  // memory_model/ranks' columns 4 and 5: read as a fit without a width term.)
  struct TimeFitRecord {
    double fixed = -1;
    double per_unit = -1;
    double per_square = -1;
  };
  std::vector<TimeFitRecord> time_fits;
  // Each rank's fingerprint of its parameters when the checkpoint was written (hex), at
  // replica_fingerprints: all equal unless the replicas drifted apart; empty in older ones.
  std::vector<std::string> replica_fingerprints;
  // Read back only: whether every dataset and the root attributes matched their checksums
  // (false: written before autoaccum wrote checksums), and how many datasets were checked.
  bool verified = false;
  std::int64_t verified_datasets = 0;
};

// Written under a temporary name and renamed onto `path`. With `keep` > 1, the checkpoint that
// was at `path` is kept as `older_checkpoint_path(path, its step)` (a hard link made before the
// rename, so `path` names a whole checkpoint at every moment), and the oldest beyond `keep` in
// all are removed after. Every dataset carries the checksum of its bytes (attribute `checksum`),
// and the root one of its attributes. Tensors go to the file as they are (from a GPU or a
// converted type: through bounded host pieces), so writing costs little memory besides the
// model's own. The file's size is reserved on its file system before anything is written (a
// full disk or quota is an InputError then, with nothing written and the older checkpoints
// untouched). Returns the bytes written.
// kOff writes or reads without checksums: only to measure what they cost (tests/bench).
enum class Checksums { kOn, kOff };
std::int64_t write_checkpoint(const std::string& path, const Checkpoint& checkpoint, int keep = 2,
                              Checksums checksums = Checksums::kOn);
// "c.h5" at step 40 -> "c.step40.h5" (a name without ".h5" gets ".step40" appended).
std::string older_checkpoint_path(const std::string& path, std::int64_t step);
// The older checkpoints kept beside `path`, newest first by the step in their names, then a
// `path.prev` left by autoaccum versions before --keep-checkpoints.
std::vector<std::string> older_checkpoints(const std::string& path);

// A checkpoint that cannot be used: its message names the file and what is wrong (the dataset
// that fails its checksum, a truncated file).
class CheckpointDamaged : public InputError {
 public:
  using InputError::InputError;
};

struct LoadedCheckpoint {
  Checkpoint checkpoint;
  std::string path;  // the file it came from
  // Each newer checkpoint passed over (its file; empty for a `path` that is missing), and why
  // ("checkpoint 'c.h5' is damaged: dataset 'params/w' does not match its checksum"); empty
  // when the newest was read.
  struct Skipped {
    std::string path;
    std::string why;
  };
  std::vector<Skipped> skipped;
};
// The newest checkpoint that reads whole and verifies: `path`, else the older ones newest
// first. Nothing when none exists; a CheckpointDamaged listing every file when none verifies.
// How the parameters are read: whole into Checkpoint::params, or (kInFile) verified in pieces
// and left in the file as Checkpoint::stored_params where they are float32 (any other type is
// read whole into `params`).
enum class Parameters { kWhole, kInFile };
std::optional<LoadedCheckpoint> read_latest_checkpoint(const std::string& path,
                                                       Parameters parameters = Parameters::kWhole);
// Reads and verifies every dataset against its checksum (and the root attributes); a
// CheckpointDamaged names the file and the dataset when one does not match, the file is
// truncated or it is not an autoaccum checkpoint. A file written before checksums reads
// unverified (`Checkpoint::verified` false).
Checkpoint read_checkpoint(const std::string& path, Checksums verify = Checksums::kOn,
                           Parameters parameters = Parameters::kWhole);
// Elements [from, from + out.numel()) of `stored` into the 1-D tensor `out` (any float type, on
// the CPU or a GPU): straight into it when it is contiguous float32 host memory, else through one
// host piece of at most 16 MiB at a time.
void read_stored(const Checkpoint::StoredTensor& stored, std::int64_t from, at::Tensor out);

}  // namespace autoaccum::io
