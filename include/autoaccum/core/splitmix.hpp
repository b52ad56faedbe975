// SplitMix64: the one portable pseudo-random step behind shuffling and synthetic data, so both
// are the same on every platform and compiler (the standard distributions are not).
#pragma once

#include <cstdint>

namespace autoaccum {

inline std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace autoaccum
