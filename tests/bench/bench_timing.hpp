// Wall clock and median for the micro-benchmarks.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace autoaccum::bench {

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace autoaccum::bench
