// Trainer: the optimizer step with automatic micro-batching, agreed OOM retries, and the loop.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "autoaccum/comm/communicator.hpp"
#include "autoaccum/train/model/model.hpp"
#include "autoaccum/train/options.hpp"

namespace autoaccum::train {

struct TrainResult {
  std::int64_t steps_done = 0;  // optimizer steps completed in total
  std::int64_t final_micro_batch = 0;
  std::vector<std::int64_t> final_micro_batches;  // every rank's, by rank
  double final_loss = 0;
  std::optional<double> eval_loss;
  std::optional<double> eval_accuracy;
  std::int64_t oom_events = 0;      // OOMs seen by any rank (rows of the run log's oom group)
  std::int64_t skipped_steps = 0;   // steps skipped for non-finite values
  std::int64_t overflow_steps = 0;  // fp16 steps skipped for an overflow (the scale halved)
  bool preempted = false;
};

class Trainer {
 public:
  // Collective: opens and checks the data, builds the model (the same on every rank), and
  // restores a checkpoint when --resume finds one. Input errors are agreed on by every rank.
  Trainer(const TrainOptions& options, comm::Communicator& comm);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains to the end (or to a signal). An OOM at micro-batch 1, or in fixed mode, ends with
  // CollectiveError (exit code 3) on every rank; a signal ends with exit code 4 after a
  // checkpoint (reported as preempted in the result, not as an exception).
  TrainResult run();

  Model& model();
  // A copy of the last step's gradient, all ranks' sum (the gradient of the mean loss over the
  // global batch), in parameter order. --shard optimizer on more than one rank leaves a rank only
  // its slice of that sum: Error there.
  at::Tensor last_gradient() const;

 private:
  TrainResult run_steps();
  struct State;
  std::unique_ptr<State> state_;
};

// Sets the flag that the next step boundary turns into a checkpoint and exit code 4.
// Installed for SIGUSR1, SIGTERM and SIGINT by install_stop_signals().
void install_stop_signals();
bool stop_requested() noexcept;

}  // namespace autoaccum::train
