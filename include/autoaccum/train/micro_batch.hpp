// MicroBatchPolicy: the current micro-batch size and what to try after an agreed OOM.
#pragma once

#include <cstdint>
#include <optional>

namespace autoaccum::train {

// Automatic: starts at the per-rank batch (or a resumed size) and halves, max(m / 2, 1), after
// each OOM that the ranks agreed on; it never grows again. Fixed: an OOM has no next size.
class MicroBatchPolicy {
 public:
  // `per_rank_rows`: the largest rank part of a batch, ceil(B / W). `fixed`: --micro-batch N.
  // `resumed`: the size a checkpoint recorded (automatic mode starts there).
  MicroBatchPolicy(std::int64_t per_rank_rows, std::optional<std::int64_t> fixed,
                   std::optional<std::int64_t> resumed = std::nullopt);

  std::int64_t current() const noexcept { return current_; }
  bool automatic() const noexcept { return automatic_; }
  // After an OOM at current(): the next size, or nothing when it cannot shrink (fixed, or 1).
  std::optional<std::int64_t> after_oom();
  // Micro-batches needed for `rows` rows: ceil(rows / current()).
  std::int64_t accumulation(std::int64_t rows) const noexcept;

 private:
  std::int64_t current_;
  bool automatic_;
};

}  // namespace autoaccum::train
