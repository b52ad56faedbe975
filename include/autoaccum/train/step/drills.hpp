// The fault drills a run was asked for, as this rank meets them: --inject-oom (an out-of-memory
// in forward, or in backward with backward=1), --inject-overflow (the first micro-batch's loss
// made infinite), --inject-slow (this rank made slower per row) and --inject-stall (a pause
// before a step). Users and tests rehearse failures with them; unasked, they cost nothing.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "autoaccum/train/options.hpp"

namespace autoaccum::train {

class Drills {
 public:
  Drills() = default;
  Drills(const TrainOptions& options, int rank);

  // An out-of-memory to throw in this micro-batch of `rows` at step `step` (0-based count of
  // finished steps): after forward, or from backward's first gradient hook.
  bool out_of_memory(bool backward, std::int64_t rows, std::int64_t step) const;
  // --inject-oom ...,backward=1 on this rank: a hook before the gradient accumulator of
  // `trainable`'s first parameter, whose gradient comes last in backward (the others exist by
  // then, and with --overlap their buckets have gone), as in a real out-of-memory late in
  // backward. Called once, after the parameters are final.
  void install_backward(const std::vector<at::Tensor>& trainable);
  // The backward pass about to run (a micro-batch of `rows` at step `step`) throws from that hook
  // when the drill says so.
  void arm_backward(std::int64_t rows, std::int64_t step) const;
  bool overflow(std::int64_t step) const;  // the first micro-batch's loss made infinite
  bool slow() const { return slow_factor_ != 1.0; }
  double slow_factor() const { return slow_factor_; }
  // After a micro-batch that began at `start`: as if this rank were `slow_factor` times slower
  // per row (the caller waits for the device first on a GPU).
  void slow_down(std::chrono::steady_clock::time_point start) const;
  void stall(std::int64_t step) const;  // before step `step`, when asked

 private:
  int rank_ = 0;
  double slow_factor_ = 1.0;
  std::vector<memory::OomInjection> out_of_memory_;
  std::vector<OverflowInjection> overflow_;
  std::vector<core::StallInjection> stall_;
  struct BackwardHook;  // the armed flag and the accumulator holding the hook
  std::shared_ptr<BackwardHook> backward_;
};

}  // namespace autoaccum::train
