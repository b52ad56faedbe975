// Balance: which rows of each global batch every rank computes (--balance throughput).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
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

// Every rank's share of each step's global batch, the same on every rank: its rows, or for
// documents parts of kTokenShares of the batch's tokens. Even unless --balance throughput
// changes them: every `every` steps, in proportion to the speeds measured since the last change,
// computed alike by every rank from the same reduced numbers. It also keeps the shares that
// automatic micro-batches of rows last followed (follow_shares).
class Balance {
 public:
  static constexpr std::int64_t kTokenShares = 1000000;
  // `every` 0: the shares stay even.
  Balance(bool documents, std::int64_t global_batch, int world, std::int64_t every);

  std::int64_t total() const { return total_; }  // what the shares add up to
  std::vector<std::int64_t> shares(std::int64_t step) const { return schedule_.shares(step); }
  std::vector<std::int64_t> offsets(std::int64_t step) const { return schedule_.offsets(step); }

  // A new split from the step after `step`, and the speeds it came from.
  struct Change {
    std::int64_t step = 0;  // the step whose measurements made it
    std::vector<std::int64_t> shares;
    std::vector<std::int64_t> rates;         // rows (or tokens) per second, rounded
    std::string text(bool documents) const;  // "step 8: rows per rank 40, 24 from step 9 (...)"
  };
  // Step `step` (the count of finished steps) ran `step_shares` on each rank in
  // `compute_seconds`. Every `every` steps before the last, the split of the step after next
  // changes (the prefetcher may be reading the next one), each rank at least its `floors`
  // (empty: one row, or one part, each).
  std::optional<Change> measure(std::int64_t step, std::int64_t total_steps,
                                const std::vector<std::int64_t>& step_shares,
                                const std::vector<double>& compute_seconds,
                                const std::vector<std::int64_t>& floors);

  // Step `step`'s shares when they differ from those automatic sizes last followed (which they
  // are now taken to follow); nothing when unchanged.
  std::optional<std::vector<std::int64_t>> to_follow(std::int64_t step);
  const std::vector<std::int64_t>& followed() const { return followed_; }

  // A checkpoint's split: `now` from `step`, `after` from the next, and the shares followed
  // (empty: `now`). False, and nothing changed, when they are not shares of this batch on this
  // many ranks.
  bool restore(std::int64_t step, const std::vector<std::int64_t>& now,
               const std::vector<std::int64_t>& after, const std::vector<std::int64_t>& followed);

 private:
  bool valid(const std::vector<std::int64_t>& shares) const;

  std::int64_t total_;
  int world_;
  std::int64_t every_;
  ShareSchedule schedule_;
  SpeedWindow window_;
  std::vector<std::int64_t> followed_;
};

}  // namespace autoaccum::train
