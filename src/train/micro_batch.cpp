// MicroBatchPolicy: halving with a floor of 1.
#include "autoaccum/train/micro_batch.hpp"

#include <algorithm>
#include <string>

#include "autoaccum/core/error.hpp"

namespace autoaccum::train {

MicroBatchPolicy::MicroBatchPolicy(std::int64_t per_rank_rows, std::optional<std::int64_t> fixed,
                                   std::optional<std::int64_t> resumed)
    : current_(per_rank_rows), automatic_(!fixed) {
  if (per_rank_rows < 1) throw Error("MicroBatchPolicy: a rank must have at least one row");
  if (fixed) {
    if (*fixed < 1) throw UsageError("--micro-batch must be 'auto' or at least 1");
    if (*fixed > per_rank_rows) {
      throw UsageError("--micro-batch " + std::to_string(*fixed) +
                       " is larger than the per-rank batch (" + std::to_string(per_rank_rows) +
                       " rows = ceil(global batch / ranks))");
    }
    current_ = *fixed;
  } else if (resumed && *resumed >= 1) {
    current_ = std::min(*resumed, per_rank_rows);
  }
}

std::optional<std::int64_t> MicroBatchPolicy::after_oom() {
  if (!automatic_ || current_ <= 1) return std::nullopt;
  current_ = std::max<std::int64_t>(current_ / 2, 1);
  return current_;
}

std::int64_t MicroBatchPolicy::accumulation(std::int64_t rows) const noexcept {
  return (rows + current_ - 1) / current_;
}

}  // namespace autoaccum::train
