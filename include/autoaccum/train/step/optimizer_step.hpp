// OptimizerStep: the update after an agreed attempt: non-finite check, clipping, schedule, step.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autoaccum/train/options.hpp"

namespace torch::optim {
class Optimizer;
class OptimizerParamState;
class AdamWParamState;
}  // namespace torch::optim

namespace autoaccum::train {

// The sum of the squares of `values` (float32), the same to the bit on every rank whatever its
// thread count, vector width or FMA: each square of a float is exact in double, fixed blocks are
// summed in a fixed order (each by one thread) and the blocks' sums in block order. It cannot
// overflow (2^31 squares of the largest float stay below 1e87), so it is non-finite exactly
// when an element is NaN or Inf. Other dtypes and devices: LibTorch's double reduction (equal
// on equal devices).
double square_sum(const at::Tensor& values);

class OptimizerStep {
 public:
  // The optimizer (--optimizer sgd|adamw) over the trainable parameters only. Its state
  // (momentum buffers, Adam moments) is allocated here, zeroed as LibTorch would create it at
  // the first step, so running out of memory for it happens at setup, not inside a step.
  // `total`, when given, turns this rank's sum of squares into the sum over every rank's
  // (--shard optimizer: each rank steps a slice; Reducer::total); the same bits on every rank.
  OptimizerStep(const TrainOptions& options, const std::vector<at::Tensor>& trainable,
                std::function<double(double)> total = {});
  ~OptimizerStep();
  OptimizerStep(const OptimizerStep&) = delete;
  OptimizerStep& operator=(const OptimizerStep&) = delete;

  enum class Result { kStepped, kSkipped, kStop };
  // `gradients`: the reduced gradients of what this optimizer steps (the views its tensors'
  // .grad() alias). A NaN
  // or Inf in the loss or any gradient (seen identically by every rank) skips the update with
  // --on-nonfinite skip, else asks the run to stop. Otherwise clips by global norm
  // (--clip-grad-norm) and steps at `lr`. Both decisions come from square_sum, so every rank
  // takes them alike, bit for bit: replicas cannot drift apart through them.
  Result apply(const at::Tensor& gradients, double loss, double lr);

  // The state per element, the same whatever the sharding: its kinds ("momentum_buffer" for SGD
  // with momentum; "exp_avg", "exp_avg_sq" for AdamW; none for plain SGD), the state of kind
  // `kind` of the `index`th tensor it steps (the tensor itself: a load writes into it), and
  // AdamW's steps taken (0 for SGD).
  std::string kind() const { return options_.optimizer; }
  std::vector<std::string> state_kinds() const;
  at::Tensor state(std::size_t index, const std::string& kind) const;
  std::int64_t step_count() const;
  void set_step_count(std::int64_t steps);
  std::size_t stepped_count() const;

  // LibTorch's archive of the state, as checkpoints before per-parameter state held it.
  void load(const std::string& bytes, const c10::Device& device);  // c10::Error on mismatch

  // The most bytes the update's temporaries take at once: it walks each tensor in pieces of at
  // most 2^20 elements (4 MiB of float32) whatever the model, and one temporary lives at a time
  // (AdamW's denominator; SGD's gradient plus weight decay); SGD without weight decay makes none.
  // A tensor that is not contiguous is stepped whole.
  std::int64_t temporary_bytes() const;

 private:
  torch::optim::OptimizerParamState& param_state(std::size_t index) const;  // of stepped tensor
  void step_in_pieces(double lr);
  void step_sgd(const at::Tensor& p, std::size_t index, double lr);
  void step_adamw(const at::Tensor& p, torch::optim::AdamWParamState& state, double lr);

  const TrainOptions& options_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::function<double(double)> total_;
};

}  // namespace autoaccum::train
