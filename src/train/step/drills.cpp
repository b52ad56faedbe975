#include "autoaccum/train/step/drills.hpp"

#include <algorithm>
#include <thread>

namespace autoaccum::train {

Drills::Drills(const TrainOptions& options, int rank)
    : rank_(rank),
      out_of_memory_(options.inject_oom),
      overflow_(options.inject_overflow),
      stall_(options.inject_stall) {
  for (const auto& slow : options.inject_slow) {
    if (slow.rank == rank) slow_factor_ = slow.factor;
  }
}

bool Drills::out_of_memory(bool backward, std::int64_t rows, std::int64_t step) const {
  return std::any_of(out_of_memory_.begin(), out_of_memory_.end(), [&](const auto& i) {
    return i.backward == backward && i.fires(rank_, rows, step);
  });
}

bool Drills::overflow(std::int64_t step) const {
  return std::any_of(overflow_.begin(), overflow_.end(),
                     [&](const auto& i) { return i.rank == rank_ && i.step == step; });
}

void Drills::slow_down(std::chrono::steady_clock::time_point start) const {
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  std::this_thread::sleep_for(took * (slow_factor_ - 1.0));
}

void Drills::stall(std::int64_t step) const {
  for (const auto& stall : stall_) {
    if (stall.rank == rank_ && stall.step == step)
      std::this_thread::sleep_for(std::chrono::duration<double>(stall.seconds));
  }
}

}  // namespace autoaccum::train
