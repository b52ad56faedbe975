// ModelState: what an attempt changes besides gradients (the model's buffers and the random
// generators), so that a failed attempt can be undone and the ranks' buffers kept equal.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "autoaccum/train/model.hpp"

namespace autoaccum::train {

class ModelState {
 public:
  // Snapshot storage is allocated here, once, so capturing never allocates during a step.
  ModelState(Model& model, c10::Device device);

  // Floats this state adds to the step's all-reduce: one per element of every floating or
  // integer buffer (BatchNorm's running statistics and num_batches_tracked).
  std::int64_t reduce_count() const noexcept { return reduce_count_; }
  std::int64_t buffer_count() const noexcept { return static_cast<std::int64_t>(buffers_.size()); }

  void capture();  // buffers and generator states now
  void restore();  // back to the last capture (a failed attempt leaves no trace)

  // Each buffer's change since capture(), as float32, into `region` (reduce_count() floats).
  void write_changes(at::Tensor region) const;
  // After the all-reduce of those changes: every buffer becomes its captured value plus the
  // mean change over `world` ranks (rounded for integer buffers), so every rank holds the same
  // statistics. Unchanged buffers stay bit for bit; one rank keeps its own values.
  void apply_mean_change(const at::Tensor& reduced, int world);

  // The random generators this process draws from (the CPU's, and the GPU's in use), as bytes
  // for a checkpoint, and back. set_generator_state throws InputError for foreign bytes. Bytes
  // that end before a generator of this run (a checkpoint written on the CPU, resumed on a GPU)
  // leave that one seeded from `fallback_seed`; it returns how many generators the bytes set.
  std::string generator_state() const;
  std::size_t set_generator_state(const std::string& bytes, std::uint64_t fallback_seed);

 private:
  std::vector<at::Tensor> buffers_;  // distinct buffers, live
  std::vector<at::Tensor> saved_;    // their captured values
  std::vector<bool> reduced_;        // floating or integer: averaged over the ranks
  std::int64_t reduce_count_ = 0;
  std::vector<c10::Device> generator_devices_;
  std::vector<at::Tensor> saved_generators_;
};

// Seeds every generator of this process from the run's seed and the rank: dropout masks differ
// between ranks and are reproducible run to run.
void seed_generators_for_rank(std::uint64_t seed, int rank);
// The seed seed_generators_for_rank gives a rank's generators.
std::uint64_t rank_seed(std::uint64_t seed, int rank) noexcept;

// Captures at construction; restores at destruction unless commit() was called.
class AttemptGuard {
 public:
  explicit AttemptGuard(ModelState& state) : state_(state) { state_.capture(); }
  ~AttemptGuard() {
    if (!committed_) state_.restore();
  }
  AttemptGuard(const AttemptGuard&) = delete;
  AttemptGuard& operator=(const AttemptGuard&) = delete;
  void commit() noexcept { committed_ = true; }

 private:
  ModelState& state_;
  bool committed_ = false;
};

}  // namespace autoaccum::train
