// Trainer's balance concern (--balance throughput): new shares of the global batch from each
// rank's measured speed.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "autoaccum/train/sizing/balance.hpp"
#include "autoaccum/train/sizing/micro_batch.hpp"

#include "../trainer_state.hpp"

namespace autoaccum::train {

// --balance throughput: every --balance-every steps, new shares in proportion to each rank's
// measured rows per second since the last change, computed by every rank from the same reduced
// numbers. They apply from the step after next: the prefetcher is already reading the next one.
void Trainer::State::rebalance(const std::vector<std::int64_t>& step_shares,
                               const std::vector<double>& compute_seconds) {
  speed_window.add(step_shares, compute_seconds);
  if (step % options.balance_every != 0 || step + 1 >= total_steps) return;
  const std::vector<double> speeds = speed_window.speeds();
  speed_window.clear();
  if (std::any_of(speeds.begin(), speeds.end(), [](double v) { return !(v > 0); })) return;
  // Rows: whole rows, each rank at least its micro-batch when that is fixed, at least one row
  // when it is automatic (the micro-batch then follows the share: follow_shares). Documents:
  // weights of the batch's tokens (parts of kTokenShares), each rank at least one part; the
  // split keeps a document per rank.
  const std::int64_t total = share_total();
  std::vector<std::int64_t> floors;
  for (int r = 0; r < world; ++r)
    floors.push_back(documents() || micro_batches->automatic()
                         ? 1
                         : std::min(micro_batches->current(r), total / world));
  const auto next = balanced_shares(total, speeds, floors);
  if (next == shares->shares(step + 1)) return;
  shares->change(step + 1, next);
  std::vector<std::int64_t> rates;
  for (double v : speeds)
    rates.push_back(static_cast<std::int64_t>(std::lround(v)));
  if (documents()) {
    std::string percents;
    for (std::size_t r = 0; r < next.size(); ++r)
      percents += (r ? ", " : "") +
                  std::to_string(std::lround(100.0 * static_cast<double>(next[r]) /
                                             static_cast<double>(total))) +
                  "%";
    say("step " + std::to_string(step) + ": tokens per rank " + percents +
        " of each batch from step " + std::to_string(step + 1) + " (measured tokens/s " +
        sizes_text(rates) + ")");
    return;
  }
  say("step " + std::to_string(step) + ": rows per rank " + sizes_text(next) + " from step " +
      std::to_string(step + 1) + " (measured rows/s " + sizes_text(rates) + ")");
}

}  // namespace autoaccum::train
