// Doubles split into float slots and read back.
#include "autoaccum/comm/exact_slots.hpp"

#include <cmath>

namespace autoaccum::comm {

void write_exact(double value, float* slots) noexcept {
  const float high = static_cast<float>(value);
  if (!std::isfinite(high)) {  // NaN, Inf, or beyond float's range: the high slot says so
    slots[0] = std::isnan(value) ? high : static_cast<float>(std::copysign(HUGE_VAL, value));
    slots[1] = slots[2] = 0.0f;
    return;
  }
  const double rest = value - static_cast<double>(high);  // exact in double
  const float middle = static_cast<float>(rest);
  slots[0] = high;
  slots[1] = middle;
  slots[2] = static_cast<float>(rest - static_cast<double>(middle));
}

double read_exact(const float* slots) noexcept {
  if (!std::isfinite(slots[0])) return static_cast<double>(slots[0]);
  return static_cast<double>(slots[0]) + static_cast<double>(slots[1]) +
         static_cast<double>(slots[2]);
}

}  // namespace autoaccum::comm
