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
#include "autoaccum/train/sizing/micro_batch.hpp"

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

Balance::Balance(bool documents, std::int64_t global_batch, int world, std::int64_t every)
    : total_(documents ? kTokenShares : global_batch),
      world_(world),
      every_(every),
      schedule_(even_shares(total_, world)),
      followed_(schedule_.shares(0)) {}

std::optional<Balance::Change> Balance::measure(std::int64_t step, std::int64_t total_steps,
                                                const std::vector<std::int64_t>& step_shares,
                                                const std::vector<double>& compute_seconds,
                                                const std::vector<std::int64_t>& floors) {
  if (every_ <= 0) return std::nullopt;
  window_.add(step_shares, compute_seconds);
  if (step % every_ != 0 || step + 1 >= total_steps) return std::nullopt;
  const std::vector<double> speeds = window_.speeds();
  window_.clear();
  if (std::any_of(speeds.begin(), speeds.end(), [](double v) { return !(v > 0); }))
    return std::nullopt;
  const std::vector<std::int64_t> least =
      floors.empty() ? std::vector<std::int64_t>(static_cast<std::size_t>(world_), 1) : floors;
  Change change;
  change.step = step;
  change.shares = balanced_shares(total_, speeds, least);
  if (change.shares == schedule_.shares(step + 1)) return std::nullopt;
  schedule_.change(step + 1, change.shares);
  for (double v : speeds)
    change.rates.push_back(static_cast<std::int64_t>(std::lround(v)));
  return change;
}

std::string Balance::Change::text(bool documents) const {
  const std::string from = " from step " + std::to_string(step + 1);
  if (!documents)
    return "step " + std::to_string(step) + ": rows per rank " + sizes_text(shares) + from +
           " (measured rows/s " + sizes_text(rates) + ")";
  const auto total =
      static_cast<double>(std::accumulate(shares.begin(), shares.end(), std::int64_t{0}));
  std::string percents;
  for (std::size_t r = 0; r < shares.size(); ++r)
    percents += (r ? ", " : "") +
                std::to_string(std::lround(100.0 * static_cast<double>(shares[r]) / total)) + "%";
  return "step " + std::to_string(step) + ": tokens per rank " + percents + " of each batch" +
         from + " (measured tokens/s " + sizes_text(rates) + ")";
}

std::optional<std::vector<std::int64_t>> Balance::to_follow(std::int64_t step) {
  std::vector<std::int64_t> now = schedule_.shares(step);
  if (now == followed_) return std::nullopt;
  followed_ = now;
  return now;
}

bool Balance::valid(const std::vector<std::int64_t>& shares) const {
  return static_cast<int>(shares.size()) == world_ &&
         std::accumulate(shares.begin(), shares.end(), std::int64_t{0}) == total_ &&
         std::all_of(shares.begin(), shares.end(), [](std::int64_t n) { return n >= 1; });
}

bool Balance::restore(std::int64_t step, const std::vector<std::int64_t>& now,
                      const std::vector<std::int64_t>& after,
                      const std::vector<std::int64_t>& followed) {
  if (!valid(now) || !valid(after)) return false;
  schedule_.change(step, now);
  schedule_.change(step + 1, after);
  followed_ = valid(followed) ? followed : now;
  return true;
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
