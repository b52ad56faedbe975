// Evaluation: the validation set's loss and accuracy, each rank on its part, summed over ranks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/train/model/model.hpp"
#include "autoaccum/train/model/objective.hpp"
#include "autoaccum/train/model/precision.hpp"

namespace autoaccum::train {

// The validation loss after a step, summed over the ranks.
struct EvalEvent {
  std::int64_t step = 0;
  double loss = 0;
  double accuracy = 0;  // NaN for regression
  bool classification = true;
  std::int64_t rows = 0;
  std::int64_t counted = 0;  // what the loss averages over: rows, tokens (not ignored), values
  std::string unit = "row";  // "row", "token", "value"
};

// One micro-batch's forward pass and loss terms: autoaccum's objective on the output, or the
// model's own (loss_sum, weight) with --loss model (then `output` is undefined).
struct ForwardResult {
  Objective::Terms terms;
  at::Tensor output;
};
ForwardResult forward_terms(Model& model, const Objective& objective,
                            const std::vector<at::Tensor>& inputs, const at::Tensor& target);

// Collective: every rank evaluates its part of `validation` in eval mode, without gradients, in
// micro-batches starting at `micro_batch` rows (halved on this rank alone after an
// out-of-memory: there is no collective inside), under autocast in `precision`, then one sum over
// the ranks. The model is back in train mode afterwards. `to_device` moves a host tensor to the
// model's device.
EvalEvent evaluate(Model& model, const Objective& objective, const data::SlabReader& validation,
                   comm::Communicator& comm, std::int64_t micro_batch, std::int64_t step,
                   Precision precision,
                   const std::function<at::Tensor(const at::Tensor&)>& to_device);

}  // namespace autoaccum::train
