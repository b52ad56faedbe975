// The learning-rate schedule: linear warm-up, then constant or cosine, per optimizer step.
#pragma once

#include <cstdint>
#include <string>

namespace autoaccum::train {

struct Schedule {
  double base_lr = 0.1;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;
  bool cosine = false;
  // The learning rate for optimizer step `step` (0-based): base * (step + 1) / warmup during
  // warm-up; then base (constant) or base * (1 + cos(pi * progress)) / 2 (cosine), where
  // progress goes from 0 at the end of warm-up to 1 at the last step.
  double lr(std::int64_t step) const;
};

Schedule make_schedule(double base_lr, std::int64_t warmup_steps, std::int64_t total_steps,
                       const std::string& kind);  // kind: constant | cosine (else UsageError)

}  // namespace autoaccum::train
