// Evaluation over each rank's part of the validation set.
#include "autoaccum/train/model/evaluation.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "autoaccum/data/batch_plan.hpp"
#include "autoaccum/data/micro_batch_plan.hpp"
#include "autoaccum/memory/memory.hpp"

namespace autoaccum::train {

ForwardResult forward_terms(Model& model, const Objective& objective,
                            const std::vector<at::Tensor>& inputs, const at::Tensor& target) {
  ForwardResult result;
  if (objective.from_model()) {
    std::tie(result.terms.sum, result.terms.weight) = model.forward_loss(inputs, target);
  } else {
    result.output = model.forward(inputs);
    result.terms = objective.terms(result.output, target);
  }
  return result;
}

EvalEvent evaluate(Model& model, const Objective& objective, const data::SlabReader& validation,
                   comm::Communicator& comm, std::int64_t micro_batch, std::int64_t step,
                   Precision precision,
                   const std::function<at::Tensor(const at::Tensor&)>& to_device) {
  torch::NoGradGuard no_grad;
  model.set_training(false);
  struct TrainAgain {
    Model& model;
    ~TrainAgain() { model.set_training(true); }
  } train_again{model};
  const data::RowRange part =
      data::BatchPlan::rank_part(validation.schema().rows, comm.size(), comm.rank());
  // Rows: m rows per micro-batch, each read as its own slab, so the read also shrinks with m.
  // Documents: up to kDocumentsPerRead documents per read, cut by a budget of m padded tokens
  // (halving stops at the longest document, which goes alone).
  constexpr std::int64_t kDocumentsPerRead = 1024;
  const bool documents = validation.schema().documents;
  const std::int64_t floor = documents ? validation.schema().max_length : 1;
  std::int64_t m = std::max(micro_batch, floor);
  double totals[4] = {0, 0, 0, 0};  // loss sum, correct, counted items, rows
  for (std::int64_t first = part.begin; first < part.end;) {
    memory::OomWatch watch;
    try {
      const std::int64_t last = std::min(part.end, first + (documents ? kDocumentsPerRead : m));
      const data::Batch slab = validation.read(first, last);
      double partial[4] = {0, 0, 0, 0};
      for (const data::MicroBatchPiece& piece : data::plan_micro_batches(slab, m).pieces) {
        const data::Batch micro = data::micro_batch(slab, piece);
        std::vector<at::Tensor> inputs;
        for (std::size_t i = 0; i + 1 < micro.size(); ++i)
          inputs.push_back(to_device(micro[i]));
        const at::Tensor target = to_device(micro[micro.size() - 1]);
        const AutocastScope autocast(precision, target.device().type());
        const ForwardResult forward = forward_terms(model, objective, inputs, target);
        partial[0] += forward.terms.sum.item<double>();
        partial[2] += forward.terms.weight.item<double>();
        if (objective.classification())
          partial[1] += objective.correct(forward.output, target).item<double>();
        partial[3] += static_cast<double>(micro.rows());
      }
      for (int i = 0; i < 4; ++i)
        totals[i] += partial[i];
      first = last;
    } catch (const std::exception& e) {
      if (!watch.explains(e) || m <= floor) throw;
      m = std::max<std::int64_t>(m / 2, floor);
      memory::release_cached_memory();
    }
  }
  comm.allreduce_sum_host(totals, 4);
  EvalEvent event;
  event.step = step;
  event.rows = static_cast<std::int64_t>(totals[3]);
  event.counted = static_cast<std::int64_t>(totals[2]);
  event.unit = objective.unit();
  event.loss = totals[0] / std::max(totals[2], 1.0);
  event.classification = objective.classification();
  event.accuracy = event.classification ? totals[1] / std::max(totals[2], 1.0) : std::nan("");
  return event;
}

}  // namespace autoaccum::train
