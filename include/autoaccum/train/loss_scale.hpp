// LossScale: dynamic loss scaling for --precision fp16, decided by all ranks together.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace autoaccum::train {

// fp16 holds values up to 65504 and flushes gradients below 6e-8 to zero. The loss is
// multiplied by the scale before backward, so small gradients survive in fp16; the fp32
// gradient buffer is divided by it after the all-reduce, together with the division by what the
// global batch counted. Every rank sees the same reduced gradients, so an overflow anywhere
// (Inf or NaN after the sum) is seen by all in the step's one collective: every rank skips the
// step and halves the scale together, and no rank takes a step another skipped. After
// `growth_interval` steps in a row without overflow the scale doubles.
class LossScale {
 public:
  static constexpr double kInitial = 65536.0;  // 2^16, as PyTorch's GradScaler
  static constexpr std::int64_t kGrowthInterval = 2000;
  // Below this an overflow is not the scale's doing (the gradients are Inf or NaN at any
  // scale): the run's --on-nonfinite handles it.
  static constexpr double kMinimum = 1.0 / 65536.0;

  // Disabled: value() is 1 and nothing changes.
  explicit LossScale(bool enabled, double initial = kInitial,
                     std::int64_t growth_interval = kGrowthInterval);

  bool enabled() const noexcept { return enabled_; }
  double value() const noexcept { return value_; }
  std::int64_t clean_steps() const noexcept { return clean_steps_; }
  // Whether a step whose reduced gradients are not finite (with a finite loss) is an overflow
  // the scale explains, to skip and back off from.
  bool explains_overflow() const noexcept { return enabled_ && value_ > kMinimum; }
  // After an agreed step: a clean one counts towards growth; an overflow halves the value.
  void after_clean_step();
  void after_overflow();
  // From a checkpoint (a value of 0: written without scaling; the scale starts afresh).
  void restore(double value, std::int64_t clean_steps);

 private:
  bool enabled_;
  double value_;
  std::int64_t growth_interval_;
  std::int64_t clean_steps_ = 0;
};

// --inject-overflow rank=R,step=S[;...]: a drill. At step S, rank R's first micro-batch's loss
// is made infinite before backward, as a loss too large for fp16 would overflow; its gradients
// become Inf/NaN and reach every rank through the all-reduce.
struct OverflowInjection {
  int rank = 0;
  std::int64_t step = 0;
};
std::vector<OverflowInjection> parse_overflow_injections(const std::string& text);

}  // namespace autoaccum::train
