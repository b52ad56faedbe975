// Balance: which rows of each global batch every rank computes (--balance throughput).
#pragma once

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace autoaccum::train {

// Shares of a global batch of `global_batch` rows proportional to `speeds` (rows per second,
// one per rank), in whole rows, each at least `floors[r]` (its micro-batch: a share smaller than
// the size the rank holds wastes its memory). Pure and deterministic: every rank computes the
// same split from the same reduced numbers. The rows are rounded by largest remainder, ties to
// the lower rank. Requires sum(floors) <= global_batch and every speed > 0.
std::vector<std::int64_t> balanced_shares(std::int64_t global_batch,
                                          const std::vector<double>& speeds,
                                          const std::vector<std::int64_t>& floors);

// The even split: rank r takes floor((r+1)B/W) - floor(rB/W) rows (data::BatchPlan's rule).
std::vector<std::int64_t> even_shares(std::int64_t global_batch, int world);

// Which split each step uses: a split from a given step on. The step loop changes it; the
// prefetch thread reads it (hence the lock). A change always starts after the step the
// prefetcher may already be reading, so no slab is read with a split that changes under it.
class ShareSchedule {
 public:
  explicit ShareSchedule(std::vector<std::int64_t> shares);
  // Rank r's rows of step `step` are [offsets[r], offsets[r+1]) of that step's global batch.
  std::vector<std::int64_t> offsets(std::int64_t step) const;
  std::vector<std::int64_t> shares(std::int64_t step) const;
  // From `step` on, `shares` (summing to the same global batch).
  void change(std::int64_t step, std::vector<std::int64_t> shares);

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<std::int64_t, std::vector<std::int64_t>>> changes_;  // ascending step
};

// Rows and compute seconds per rank over the steps since the last rebalance.
struct SpeedWindow {
  std::vector<double> rows;
  std::vector<double> seconds;
  std::int64_t steps = 0;
  void add(const std::vector<std::int64_t>& shares, const std::vector<double>& compute_seconds);
  std::vector<double> speeds() const;  // rows / seconds; 0 where nothing was measured
  void clear() { *this = SpeedWindow{}; }
};

}  // namespace autoaccum::train
