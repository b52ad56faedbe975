// OptimizerStep: the update after an agreed attempt: non-finite check, clipping, schedule, step.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "autoaccum/train/options.hpp"

namespace torch::optim {
class Optimizer;
}

namespace autoaccum::train {

class OptimizerStep {
 public:
  // The optimizer (--optimizer sgd|adamw) over the trainable parameters only. Its state
  // (momentum buffers, Adam moments) is allocated here, zeroed as LibTorch would create it at
  // the first step, so running out of memory for it happens at setup, not inside a step.
  OptimizerStep(const TrainOptions& options, const std::vector<at::Tensor>& trainable);
  ~OptimizerStep();
  OptimizerStep(const OptimizerStep&) = delete;
  OptimizerStep& operator=(const OptimizerStep&) = delete;

  enum class Result { kStepped, kSkipped, kStop };
  // `gradients`: the reduced gradient region (the views the parameters' .grad() alias). A NaN
  // or Inf in the loss or any gradient (seen identically by every rank) skips the update with
  // --on-nonfinite skip, else asks the run to stop. Otherwise clips by global norm
  // (--clip-grad-norm) and steps at `lr`.
  Result apply(const at::Tensor& gradients, double loss, double lr);

  std::string save() const;                                        // LibTorch's archive, as bytes
  void load(const std::string& bytes, const c10::Device& device);  // c10::Error on mismatch

 private:
  const TrainOptions& options_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace autoaccum::train
