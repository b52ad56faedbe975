// Schedule: pure arithmetic, identical on every rank.
#include "autoaccum/train/step/schedule.hpp"

#include <algorithm>
#include <cmath>

#include "autoaccum/core/error.hpp"

namespace autoaccum::train {

double Schedule::lr(std::int64_t step) const {
  if (step < warmup_steps) {
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (!cosine) return base_lr;
  const std::int64_t span = std::max<std::int64_t>(1, total_steps - warmup_steps - 1);
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(span));
  return base_lr * 0.5 * (1.0 + std::cos(M_PI * progress));
}

Schedule make_schedule(double base_lr, std::int64_t warmup_steps, std::int64_t total_steps,
                       const std::string& kind) {
  if (kind != "constant" && kind != "cosine") {
    throw UsageError("--schedule: '" + kind + "' is not one of constant, cosine");
  }
  if (warmup_steps < 0) throw UsageError("--warmup-steps must not be negative");
  return Schedule{base_lr, warmup_steps, std::max<std::int64_t>(total_steps, 1), kind == "cosine"};
}

}  // namespace autoaccum::train
