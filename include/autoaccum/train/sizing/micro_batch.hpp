// MicroBatchPolicy: the current micro-batch size and what to try after an agreed OOM.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace autoaccum::train {

// Automatic: starts at the per-rank batch (or a resumed size) and halves, max(m / 2, 1), after
// each OOM that the ranks agreed on. Fixed: an OOM has no next size.
//
// With `refine` (--micro-batch-search refine), once a size fits below one that did not, later
// steps probe upwards by bisection between the largest size that fitted and the smallest that
// did not, until the gap is under 1/16 of the fitting size: a limit that holds 80 rows then ends
// at ~80 instead of the power-of-two fraction 64. A probe that runs out of memory retries its
// step at the last size that fitted. Every rank runs the same policy on the same agreed events,
// so the sizes stay equal everywhere.
class MicroBatchPolicy {
 public:
  // `per_rank_rows`: the largest rank part of a batch, ceil(B / W). `fixed`: --micro-batch N.
  // `resumed`: the size a checkpoint recorded (automatic mode starts there). `floor`: the
  // smallest size halving may reach (document data: the longest document, in tokens).
  MicroBatchPolicy(std::int64_t per_rank_rows, std::optional<std::int64_t> fixed,
                   std::optional<std::int64_t> resumed = std::nullopt, bool refine = false,
                   std::int64_t floor = 1);

  std::int64_t current() const noexcept { return current_; }
  bool automatic() const noexcept { return automatic_; }
  // After an OOM at current(): the next size, or nothing when it cannot shrink (fixed, or at
  // the floor).
  std::optional<std::int64_t> after_oom();
  // After a step that succeeded at current(): with `refine`, may set a larger size to probe at
  // the next step; returns true when it did.
  bool after_success();
  bool probing() const noexcept { return probing_; }  // current() is an untried size
  // --micro-batch-regrow N (0: off): N clean steps after an out-of-memory lowered the size, try
  // once more the size it held before (a transient peak, such as one long batch, should not
  // cost the rest of the run). If that runs out again, back to the size that ran, and no more
  // regrowing to it: at most one more out-of-memory per lowering.
  void set_regrow(std::int64_t steps) noexcept { regrow_steps_ = steps; }
  bool regrowing() const noexcept { return regrowing_; }  // current() is a regrow attempt
  // Automatic mode: continue at `size` (a memory model's prediction, kept within the floor and
  // the per-rank rows); `failed`, when not 0, is a size known not to fit (refine stays below it).
  void start_at(std::int64_t size, std::int64_t failed = 0);
  // Automatic mode, --balance throughput: the rank's share is now `rows` (its new cap). The size
  // becomes the largest known to fit within the share: `predicted` (a memory model's prediction,
  // at most `rows`) or the largest size that completed, whichever is larger; without a
  // prediction, the whole share while nothing ran out, else no larger than now. Evened out over
  // the micro-batches it needs (384 rows at 300 run as 2 x 192). Returns true when it changed.
  bool follow_share(std::int64_t rows, std::optional<std::int64_t> predicted);
  // Automatic mode, a resume under --balance throughput: the share `rows` the recorded `size`
  // followed becomes the cap again, and the size is kept within it (a size grown past the even
  // share stays as it was).
  void resume_share(std::int64_t rows, std::int64_t size);
  // Micro-batches needed for `rows` rows: ceil(rows / current()).
  std::int64_t accumulation(std::int64_t rows) const noexcept;

 private:
  std::int64_t current_;
  bool automatic_;
  bool refine_ = false;
  bool probing_ = false;
  std::int64_t per_rank_rows_ = 1;
  std::int64_t floor_ = 1;
  std::int64_t fitted_ = 0;        // the largest size that completed a step (0: none yet)
  std::int64_t failed_ = 0;        // the smallest size that ran out of memory (0: none yet)
  std::int64_t regrow_steps_ = 0;  // --micro-batch-regrow (0: off)
  std::int64_t regrow_to_ = 0;     // the size held before the last lowering (0: none)
  std::int64_t clean_steps_ = 0;   // steps completed since the last out-of-memory
  bool regrowing_ = false;
};

// Every rank's micro-batch, held by every rank: one MicroBatchPolicy per rank, all driven by the
// agreed outcome of each attempt (which ranks ran out of memory, whether the step succeeded), so
// every rank knows every other rank's size without sending it.
//
// Scope global (--micro-batch-scope global, the default): any rank's out-of-memory shrinks every
// rank's size, so the sizes stay equal. Scope rank: only the ranks that ran out shrink (a rank
// with less memory no longer drags the others down); each rank's refine search runs on its own.
class RankMicroBatches {
 public:
  // `resumed`: the sizes a checkpoint recorded, one per rank (or empty).
  RankMicroBatches(int world, std::int64_t per_rank_rows, std::optional<std::int64_t> fixed,
                   const std::vector<std::int64_t>& resumed, bool refine, bool per_rank,
                   std::int64_t floor = 1);

  std::int64_t current(int rank) const {
    return policies_.at(static_cast<std::size_t>(rank)).current();
  }
  std::vector<std::int64_t> sizes() const;
  bool automatic() const noexcept { return policies_.front().automatic(); }
  bool per_rank() const noexcept { return per_rank_; }
  bool probing(int rank) const { return policies_.at(static_cast<std::size_t>(rank)).probing(); }
  bool regrowing(int rank) const {
    return policies_.at(static_cast<std::size_t>(rank)).regrowing();
  }
  void set_regrow(std::int64_t steps) {
    for (auto& p : policies_)
      p.set_regrow(steps);
  }
  std::int64_t accumulation(int rank, std::int64_t rows) const {
    return policies_.at(static_cast<std::size_t>(rank)).accumulation(rows);
  }

  // After an attempt in which `out_of_memory` ran out (ascending): shrinks the sizes the scope
  // says. Returns false when one of the ranks that ran out cannot shrink (fixed, or at 1).
  bool after_oom(const std::vector<int>& out_of_memory);
  // After a step that succeeded: the ranks whose refine search now probes a larger size.
  std::vector<int> after_success();
  // "64" when every rank has the same size, else "64, 32, 64" (rank order).
  std::string describe() const;
  // Automatic mode: every rank's size follows its share (MicroBatchPolicy::follow_share);
  // `predicted` holds one entry per rank. Returns the ranks whose size changed.
  std::vector<int> follow_shares(const std::vector<std::int64_t>& rows,
                                 const std::vector<std::optional<std::int64_t>>& predicted);
  // A resume under --balance throughput: rank r's size sizes[r] within its share rows[r]
  // (MicroBatchPolicy::resume_share).
  void resume_shares(const std::vector<std::int64_t>& rows, const std::vector<std::int64_t>& sizes);
  // Automatic mode: every rank continues at its size in `sizes` (MicroBatchPolicy::start_at).
  void start_at(const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& failed);

 private:
  std::vector<MicroBatchPolicy> policies_;
  bool per_rank_ = false;
};

// "64" or "64, 32" (a list of sizes for messages).
std::string sizes_text(const std::vector<std::int64_t>& sizes);

}  // namespace autoaccum::train
