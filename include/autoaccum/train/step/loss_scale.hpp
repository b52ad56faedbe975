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
//
// The loss is a sum, not a mean: its gradients are `count` times a mean's, so the scale starts
// at initial_for(count), the largest power of two <= 2^16 / count (PyTorch's GradScaler starts
// at 2^16 on a mean), and never grows past kMaximum: a summed cross-entropy's gradient reaches
// 1 per logit (p - 1 for a target the model gives no chance), which times 2^16 passes 65504.
class LossScale {
 public:
  static constexpr double kInitial = 65536.0;  // 2^16, as PyTorch's GradScaler on a mean loss
  static constexpr double kMaximum = 32768.0;  // 2^15
  static constexpr std::int64_t kGrowthInterval = 2000;
  // Below this an overflow is not the scale's doing (the gradients are Inf or NaN at any
  // scale): the run's --on-nonfinite handles it.
  static constexpr double kMinimum = 1.0 / 65536.0;

  // Disabled: value() is 1 and nothing changes.
  explicit LossScale(bool enabled, double initial = kMaximum,
                     std::int64_t growth_interval = kGrowthInterval);
  // The start for a summed loss over `count` units (rows, or tokens that count) per rank and
  // step: a power of two in [1, kMaximum].
  static double initial_for(double count);

  bool enabled() const noexcept { return enabled_; }
  double value() const noexcept { return value_; }
  std::int64_t clean_steps() const noexcept { return clean_steps_; }
  // Whether a step whose reduced gradients are not finite (with a finite loss) is an overflow
  // the scale explains, to skip and back off from.
  bool explains_overflow() const noexcept { return enabled_ && value_ > kMinimum; }
  // After an agreed step: a clean one counts towards growth (up to kMaximum); an overflow
  // halves the value.
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
