// A double carried exactly through a float32 sum over ranks.
#pragma once

#include <cstddef>

namespace autoaccum::comm {

// Three floats whose sum, taken in double, is the value (53 bits of mantissa in three pieces of
// 24). A slot that only one rank writes arrives unchanged through a sum over ranks (x + 0 = x),
// so counts and loss sums stay exact at any size (a float slot stops counting exactly at 2^24
// tokens) and are added up in double, in rank order, by every rank alike.
constexpr std::size_t kExactSlots = 3;
void write_exact(double value, float* slots) noexcept;
double read_exact(const float* slots) noexcept;

}  // namespace autoaccum::comm
