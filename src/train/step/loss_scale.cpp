// LossScale and the --inject-overflow drill's parser.
#include "autoaccum/train/step/loss_scale.hpp"

#include <algorithm>

#include "autoaccum/core/drill.hpp"

namespace autoaccum::train {

LossScale::LossScale(bool enabled, double initial, std::int64_t growth_interval)
    : enabled_(enabled), value_(enabled ? initial : 1.0), growth_interval_(growth_interval) {}

double LossScale::initial_for(double count) {
  double scale = kMaximum;
  while (scale > 1.0 && scale * std::max(count, 1.0) > kInitial)
    scale *= 0.5;
  return scale;
}

void LossScale::after_clean_step() {
  if (!enabled_) return;
  if (++clean_steps_ >= growth_interval_) {
    value_ = std::min(value_ * 2.0, std::max(kMaximum, value_));
    clean_steps_ = 0;
  }
}

void LossScale::after_overflow() {
  if (!enabled_) return;
  value_ *= 0.5;
  clean_steps_ = 0;
}

void LossScale::restore(double value, std::int64_t clean_steps) {
  if (!enabled_ || !(value > 0)) return;
  value_ = value;
  clean_steps_ = clean_steps;
}

std::vector<OverflowInjection> parse_overflow_injections(const std::string& text) {
  std::vector<OverflowInjection> all;
  for (const auto& item : core::parse_drill("--inject-overflow", text, {"rank", "step"},
                                            {"rank", "step"}, {"rank", "step"}, "rank=R,step=S")) {
    all.push_back({static_cast<int>(item.integer("rank")), item.integer("step")});
  }
  return all;
}

}  // namespace autoaccum::train
