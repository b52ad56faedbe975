// Balance: proportional shares in whole rows, and the split schedule the prefetcher reads.
#include "autoaccum/train/sizing/balance.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <string>

#include "autoaccum/core/drill.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/train/options.hpp"

namespace autoaccum::train {

std::vector<std::int64_t> even_shares(std::int64_t global_batch, int world) {
  std::vector<std::int64_t> shares;
  for (int r = 0; r < world; ++r)
    shares.push_back((r + 1) * global_batch / world - r * global_batch / world);
  return shares;
}

std::vector<std::int64_t> balanced_shares(std::int64_t global_batch,
                                          const std::vector<double>& speeds,
                                          const std::vector<std::int64_t>& floors) {
  const std::size_t world = speeds.size();
  if (world == 0 || floors.size() != world) throw Error("balanced_shares: one speed per rank");
  if (std::accumulate(floors.begin(), floors.end(), std::int64_t{0}) > global_batch)
    throw Error("balanced_shares: the floors exceed the global batch");
  for (double s : speeds) {
    if (!(s > 0) || !std::isfinite(s)) throw Error("balanced_shares: a speed is not positive");
  }
  // Water-filling: ranks whose proportional share is under their floor get the floor; the rest
  // of the batch is shared by the others in proportion to their speeds, until no share moves.
  std::vector<bool> pinned(world, false);
  std::vector<double> target(world, 0.0);
  for (;;) {
    double free_rows = static_cast<double>(global_batch), free_speed = 0;
    for (std::size_t r = 0; r < world; ++r) {
      if (pinned[r])
        free_rows -= static_cast<double>(floors[r]);
      else
        free_speed += speeds[r];
    }
    bool changed = false;
    for (std::size_t r = 0; r < world; ++r) {
      if (pinned[r]) {
        target[r] = static_cast<double>(floors[r]);
        continue;
      }
      target[r] = free_speed > 0 ? free_rows * speeds[r] / free_speed : 0.0;
      if (target[r] < static_cast<double>(floors[r])) {
        pinned[r] = true;
        changed = true;
      }
    }
    if (!changed) break;
  }
  // Whole rows: floors of the targets (never below a rank's floor), then the rows left over to
  // the largest remainders.
  std::vector<std::int64_t> shares(world);
  std::int64_t given = 0;
  for (std::size_t r = 0; r < world; ++r) {
    shares[r] = std::max(floors[r], static_cast<std::int64_t>(std::floor(target[r])));
    given += shares[r];
  }
  std::vector<std::size_t> order(world);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return target[a] - std::floor(target[a]) > target[b] - std::floor(target[b]);
  });
  for (std::size_t i = 0; given < global_batch; i = (i + 1) % world) {
    ++shares[order[i]];
    ++given;
  }
  // Rounding up floors can overshoot by a row or two: take them from the largest shares above
  // their floors.
  while (given > global_batch) {
    std::size_t widest = world;
    for (std::size_t r = 0; r < world; ++r) {
      if (shares[r] > floors[r] && (widest == world || shares[r] > shares[widest])) widest = r;
    }
    --shares[widest];
    --given;
  }
  return shares;
}

ShareSchedule::ShareSchedule(std::vector<std::int64_t> shares) {
  changes_.emplace_back(0, std::move(shares));
}

std::vector<std::int64_t> ShareSchedule::shares(std::int64_t step) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<std::int64_t>* current = &changes_.front().second;
  for (const auto& [from, shares] : changes_) {
    if (from <= step) current = &shares;
  }
  return *current;
}

std::vector<std::int64_t> ShareSchedule::offsets(std::int64_t step) const {
  const auto parts = shares(step);
  std::vector<std::int64_t> out{0};
  for (std::int64_t p : parts)
    out.push_back(out.back() + p);
  return out;
}

void ShareSchedule::change(std::int64_t step, std::vector<std::int64_t> shares) {
  const std::lock_guard<std::mutex> lock(mutex_);
  // Entries from `step` on are replaced; the older ones stay for steps still being read.
  changes_.erase(std::remove_if(changes_.begin() + 1, changes_.end(),
                                [&](const auto& c) { return c.first >= step; }),
                 changes_.end());
  changes_.emplace_back(step, std::move(shares));
  // Keep the list short: only the last entry at or before any step still ahead matters, and
  // steps before `step - 2` are never asked for again.
  while (changes_.size() > 3 && changes_[1].first <= step - 2)
    changes_.erase(changes_.begin());
}

void SpeedWindow::add(const std::vector<std::int64_t>& shares,
                      const std::vector<double>& compute_seconds) {
  rows.resize(shares.size(), 0.0);
  seconds.resize(shares.size(), 0.0);
  for (std::size_t r = 0; r < shares.size() && r < compute_seconds.size(); ++r) {
    rows[r] += static_cast<double>(shares[r]);
    seconds[r] += compute_seconds[r];
  }
  ++steps;
}

std::vector<double> SpeedWindow::speeds() const {
  std::vector<double> out;
  for (std::size_t r = 0; r < rows.size(); ++r)
    out.push_back(seconds[r] > 0 ? rows[r] / seconds[r] : 0.0);
  return out;
}

std::vector<SlowInjection> parse_slow_injections(const std::string& text) {
  const std::string form = "rank=R,factor=F";
  std::vector<SlowInjection> all;
  for (const auto& item : core::parse_drill("--inject-slow", text, {"rank", "factor"},
                                            {"rank", "factor"}, {"rank"}, form)) {
    SlowInjection injection;
    injection.rank = static_cast<int>(item.integer("rank"));
    injection.factor = item.values.at("factor");
    if (!(injection.factor > 0) || !std::isfinite(injection.factor))
      throw core::drill_error("--inject-slow", item,
                              "factor must be positive (1: normal speed, 2: twice as slow)", form);
    all.push_back(injection);
  }
  return all;
}

}  // namespace autoaccum::train
