#include "autoaccum/train/step/drills.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/trainer.hpp"

namespace autoaccum::train {
namespace {

// Runs before a gradient accumulator (called even when a fused layer already added its gradient
// and passes none on, which a tensor hook would not see).
class InjectedOutOfMemory final : public torch::autograd::FunctionPreHook {
 public:
  explicit InjectedOutOfMemory(std::atomic<bool>& armed) : armed_(armed) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (armed_.exchange(false)) {
      memory::throw_out_of_memory(
          "injected out-of-memory (--inject-oom backward=1) in the backward pass");
    }
    return grads;
  }

 private:
  std::atomic<bool>& armed_;
};

}  // namespace

struct Drills::BackwardHook {
  std::atomic<bool> armed{false};
  std::shared_ptr<torch::autograd::Node> accumulator;  // holds the hook
};

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

void Drills::install_backward(const std::vector<at::Tensor>& trainable) {
  const bool mine = std::any_of(out_of_memory_.begin(), out_of_memory_.end(),
                                [&](const auto& i) { return i.backward && i.rank == rank_; });
  if (!mine || trainable.empty()) return;
  backward_ = std::make_shared<BackwardHook>();
  backward_->accumulator = torch::autograd::impl::grad_accumulator(trainable.front());
  backward_->accumulator->add_pre_hook(std::make_unique<InjectedOutOfMemory>(backward_->armed));
}

void Drills::arm_backward(std::int64_t rows, std::int64_t step) const {
  if (backward_) backward_->armed.store(out_of_memory(/*backward=*/true, rows, step));
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
    if (stall.rank != rank_ || stall.step != step) continue;
    // A stop signal ends it early: the step boundary it would reach next turns the signal into
    // a checkpoint at once (a job signalled during the drill need not sit out the rest of it).
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(stall.seconds));
    while (!stop_requested() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace autoaccum::train
