// ModelState: what an attempt changes besides gradients (the model's buffers and the random
// generators), so that a failed attempt can be undone and the ranks' buffers kept equal.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "autoaccum/train/model/model.hpp"

namespace autoaccum::train {

class ModelState {
 public:
  // Snapshot storage is allocated here, once, so capturing never allocates during a step.
  // `rank` of `world`: where this rank writes a float64 buffer's change (below).
  ModelState(Model& model, c10::Device device, int world = 1, int rank = 0);

  // Floats this state adds to the step's all-reduce. One per element of every float32, half,
  // bfloat16 or integer buffer (BatchNorm's running statistics and num_batches_tracked): their
  // changes are summed over the ranks in float, exact for integers while the sum stays below
  // 2^24. A float64 buffer's change keeps its 53 bits: each rank writes it as comm::kExactSlots
  // floats (comm/exact_slots.hpp) into slots of its own, comm::kExactSlots x world per element, and
  // every rank adds the ranks' changes up in double, in rank order, alike.
  std::int64_t reduce_count() const noexcept { return reduce_count_; }
  std::int64_t averaged_values() const noexcept { return averaged_values_; }  // buffer elements
  std::int64_t buffer_count() const noexcept { return static_cast<std::int64_t>(buffers_.size()); }

  void capture();  // buffers and generator states now
  void restore();  // back to the last capture (a failed attempt leaves no trace)

  // Each buffer's change since capture() into `region` (reduce_count() floats, on the
  // buffers' device).
  void write_changes(at::Tensor region) const;
  // After the all-reduce of those changes: every buffer becomes its captured value plus the
  // mean change over the ranks (rounded for integer buffers), so every rank holds the same
  // statistics. Unchanged buffers stay bit for bit; one rank keeps its own values.
  void apply_mean_change(const at::Tensor& reduced);

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
  int world_ = 1;
  int rank_ = 0;
  std::int64_t reduce_count_ = 0;
  std::int64_t averaged_values_ = 0;
  std::vector<c10::Device> generator_devices_;
  std::vector<at::Tensor> saved_generators_;
};

// Double values as the float pieces comm::write_exact (comm/exact_slots.hpp) makes of them,
// computed on their device without a host synchronisation: comm::kExactSlots floats per value, one
// value after the other (for finite values in float's range). Used for the step's exact control
// values and float64 buffer changes.
at::Tensor exact_pieces(const at::Tensor& values);

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
