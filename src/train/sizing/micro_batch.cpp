// MicroBatchPolicy: halving down to a floor (1 row, or the longest document's tokens).
#include "autoaccum/train/sizing/micro_batch.hpp"

#include <algorithm>
#include <string>

#include "autoaccum/core/error.hpp"

namespace autoaccum::train {

MicroBatchPolicy::MicroBatchPolicy(std::int64_t per_rank_rows, std::optional<std::int64_t> fixed,
                                   std::optional<std::int64_t> resumed, bool refine,
                                   std::int64_t floor)
    : current_(per_rank_rows),
      automatic_(!fixed),
      refine_(refine && !fixed),
      per_rank_rows_(per_rank_rows),
      floor_(std::max<std::int64_t>(1, std::min(floor, per_rank_rows))) {
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
    current_ = std::max(floor_, std::min(*resumed, per_rank_rows));
  }
}

std::optional<std::int64_t> MicroBatchPolicy::after_oom() {
  if (!automatic_ || current_ <= floor_) return std::nullopt;
  failed_ = failed_ > 0 ? std::min(failed_, current_) : current_;
  clean_steps_ = 0;
  if (regrowing_ && fitted_ > 0 && fitted_ < current_) {
    // The size it held before still does not fit: back to the one that ran, for good.
    current_ = fitted_;
    regrowing_ = probing_ = false;
    regrow_to_ = 0;
    return current_;
  }
  // The first lowering of a series remembers the size to try again (--micro-batch-regrow).
  if (regrow_to_ == 0) regrow_to_ = current_;
  regrowing_ = false;
  if (refine_ && probing_ && fitted_ > 0 && fitted_ < current_) {
    current_ = fitted_;  // the probe did not fit: back to the last size that did
  } else {
    if (fitted_ >= current_) fitted_ = 0;  // a size that fitted before no longer does
    current_ = std::max<std::int64_t>(current_ / 2, floor_);
  }
  probing_ = false;
  return current_;
}

bool MicroBatchPolicy::after_success() {
  probing_ = false;
  fitted_ = std::max(fitted_, current_);
  if (regrowing_) {
    // The lowering was transient: the size it held fits again.
    regrowing_ = false;
    regrow_to_ = 0;
    if (failed_ > 0 && failed_ <= current_) failed_ = 0;
  }
  ++clean_steps_;
  regrow_to_ = std::min(regrow_to_, per_rank_rows_);  // a share may have shrunk since
  if (regrow_steps_ > 0 && regrow_to_ > current_ && clean_steps_ >= regrow_steps_) {
    current_ = regrow_to_;
    regrowing_ = probing_ = true;
    return true;
  }
  if (!refine_ || failed_ == 0 || fitted_ >= per_rank_rows_) return false;
  const std::int64_t resolution = std::max<std::int64_t>(1, fitted_ / 16);
  if (failed_ - fitted_ <= resolution) return false;
  const std::int64_t probe = fitted_ + (failed_ - fitted_) / 2;
  if (probe <= fitted_ || probe >= failed_) return false;
  current_ = probe;
  probing_ = true;
  return true;
}

void MicroBatchPolicy::start_at(std::int64_t size, std::int64_t failed) {
  if (!automatic_) return;
  current_ = std::max(floor_, std::min(size, per_rank_rows_));
  fitted_ = 0;
  probing_ = regrowing_ = false;
  regrow_to_ = clean_steps_ = 0;
  if (failed > current_) failed_ = failed_ > 0 ? std::min(failed_, failed) : failed;
}

bool MicroBatchPolicy::follow_share(std::int64_t rows, std::optional<std::int64_t> predicted) {
  if (!automatic_ || rows < 1) return false;
  per_rank_rows_ = rows;
  floor_ = std::min(floor_, rows);
  std::int64_t size = 0;
  if (predicted)
    size = std::max(*predicted, fitted_);
  else
    size = failed_ > 0 ? std::max(current_, fitted_) : rows;
  if (failed_ > 0) size = std::min(size, failed_ - 1);
  size = std::max(floor_, std::min(size, rows));
  const std::int64_t count = (rows + size - 1) / size;
  size = (rows + count - 1) / count;
  const bool changed = size != current_;
  current_ = size;
  probing_ = false;
  return changed;
}

void MicroBatchPolicy::resume_share(std::int64_t rows, std::int64_t size) {
  if (!automatic_ || rows < 1 || size < 1) return;
  per_rank_rows_ = rows;
  floor_ = std::min(floor_, rows);
  current_ = std::max(floor_, std::min(size, rows));
}

std::int64_t MicroBatchPolicy::accumulation(std::int64_t rows) const noexcept {
  return (rows + current_ - 1) / current_;
}

RankMicroBatches::RankMicroBatches(int world, std::int64_t per_rank_rows,
                                   std::optional<std::int64_t> fixed,
                                   const std::vector<std::int64_t>& resumed, bool refine,
                                   bool per_rank, std::int64_t floor)
    : per_rank_(per_rank) {
  if (world < 1) throw Error("RankMicroBatches: no ranks");
  for (int r = 0; r < world; ++r) {
    std::optional<std::int64_t> start;
    if (!resumed.empty()) start = resumed[static_cast<std::size_t>(r) % resumed.size()];
    policies_.emplace_back(per_rank_rows, fixed, start, refine, floor);
  }
}

std::vector<std::int64_t> RankMicroBatches::sizes() const {
  std::vector<std::int64_t> out;
  for (const auto& p : policies_)
    out.push_back(p.current());
  return out;
}

bool RankMicroBatches::after_oom(const std::vector<int>& out_of_memory) {
  bool possible = true;
  for (std::size_t r = 0; r < policies_.size(); ++r) {
    const bool ran_out = std::find(out_of_memory.begin(), out_of_memory.end(),
                                   static_cast<int>(r)) != out_of_memory.end();
    if (per_rank_ && !ran_out) continue;
    const bool shrank = policies_[r].after_oom().has_value();
    if (ran_out && !shrank) possible = false;
  }
  return possible;
}

std::vector<int> RankMicroBatches::after_success() {
  std::vector<int> probing;
  for (std::size_t r = 0; r < policies_.size(); ++r) {
    if (policies_[r].after_success()) probing.push_back(static_cast<int>(r));
  }
  return probing;
}

std::vector<int> RankMicroBatches::follow_shares(
    const std::vector<std::int64_t>& rows,
    const std::vector<std::optional<std::int64_t>>& predicted) {
  std::vector<int> changed;
  for (std::size_t r = 0; r < policies_.size() && r < rows.size(); ++r) {
    if (policies_[r].follow_share(rows[r], r < predicted.size() ? predicted[r] : std::nullopt))
      changed.push_back(static_cast<int>(r));
  }
  return changed;
}

void RankMicroBatches::resume_shares(const std::vector<std::int64_t>& rows,
                                     const std::vector<std::int64_t>& sizes) {
  for (std::size_t r = 0; r < policies_.size() && r < rows.size() && r < sizes.size(); ++r)
    policies_[r].resume_share(rows[r], sizes[r]);
}

void RankMicroBatches::start_at(const std::vector<std::int64_t>& sizes,
                                const std::vector<std::int64_t>& failed) {
  for (std::size_t r = 0; r < policies_.size() && r < sizes.size(); ++r)
    policies_[r].start_at(sizes[r], r < failed.size() ? failed[r] : 0);
}

std::string RankMicroBatches::describe() const {
  const auto all = sizes();
  if (std::all_of(all.begin(), all.end(), [&](std::int64_t m) { return m == all.front(); }))
    return std::to_string(all.front());
  std::string text;
  for (std::size_t r = 0; r < all.size(); ++r)
    text += (r ? ", " : "") + std::to_string(all[r]);
  return text;
}

std::string sizes_text(const std::vector<std::int64_t>& sizes) {
  std::string text;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text;
}

}  // namespace autoaccum::train
