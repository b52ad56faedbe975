// Trainer's evaluation (--val-data): at the size it runs in, its result for the run and the
// observers; the computation itself is model/evaluation.cpp.
#include <torch/torch.h>

#include <algorithm>
#include <optional>

#include "autoaccum/train/model/evaluation.hpp"

#include "run_state.hpp"

namespace autoaccum::train {

// Rows per forward: --eval-micro-batch, or four times the training micro-batch (no gradients, no
// optimizer state to hold), at least 256.
void Trainer::State::evaluate() {
  if (!feed.validation()) return;
  const std::int64_t m =
      options.eval_micro_batch > 0
          ? options.eval_micro_batch
          : std::max<std::int64_t>(sizing.micro_batches().current(rank) * 4, 256);
  const EvalEvent event = train::evaluate(
      bundle->model(), bundle->objective(), *feed.validation(), comm, m, step, options.precision,
      [this](const at::Tensor& t) { return context.on_device(t); });
  result.eval_loss = event.loss;
  result.eval_accuracy =
      event.classification ? std::optional<double>(event.accuracy) : std::nullopt;
  reporter.notify([&](StepObserver& o) { o.on_eval(event); });
}

}  // namespace autoaccum::train
