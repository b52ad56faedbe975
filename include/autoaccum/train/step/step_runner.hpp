// StepRunner: one optimizer step at a batch, on every rank alike. It attempts the rank's slab in
// micro-batches of the size sizing gives it (forward, loss, backward; the gradients accumulate
// into the exchange's buffer), reduces once with this rank's report in the control table, and
// takes the outcome every rank agrees on from it: the update, or after an agreed out-of-memory
// the sizes lowered (sizing decides) and another attempt at the same batch. Before the first
// step it drives the probes sizing asks for, attempts that always roll back. It owns the control
// table, the fault drills and what it measures; the run owns the rooms it uses (it checkpoints
// and evaluates them) and decides when steps, checkpoints and evaluations happen.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"
#include "autoaccum/data/micro_batch_plan.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/train/model/device_context.hpp"
#include "autoaccum/train/model/model_bundle.hpp"
#include "autoaccum/train/options.hpp"
#include "autoaccum/train/reduce/gradient_exchange.hpp"
#include "autoaccum/train/sizing/data_feed.hpp"
#include "autoaccum/train/sizing/memory_probe.hpp"
#include "autoaccum/train/sizing/sizing.hpp"
#include "autoaccum/train/step/drills.hpp"
#include "autoaccum/train/step/loss_scale.hpp"
#include "autoaccum/train/step/optimizer_step.hpp"
#include "autoaccum/train/step/reporter.hpp"
#include "autoaccum/train/step/schedule.hpp"
#include "autoaccum/train/step/step_agreement.hpp"

namespace autoaccum::train {

// What the optimizer did with a step's gradients.
struct OptimizerUpdate {
  double lr = 0;
  double loss_scale = 1;  // the fp16 loss scale the step ran at
  bool skipped = false;   // non-finite values or an fp16 overflow
};

class StepRunner {
 public:
  // What the step uses, built at set-up and owned by the run.
  struct Rooms {
    const TrainOptions& options;
    comm::Communicator& comm;
    const DeviceContext& context;
    ModelBundle& model;  // the model, its objective, parameters and attempt state
    OptimizerStep& optimizer;
    const Schedule& schedule;
    LossScale& loss_scale;
    GradientExchange& exchange;
    Sizing& sizing;
    const DataFeed& feed;
    Reporter& reporter;
  };
  explicit StepRunner(Rooms rooms);

  // The control table's floats on `world` ranks: the exchange carries them.
  static std::int64_t control_floats(int world);

  // Before step `step`: --inject-stall's pause, when asked.
  void stall(std::int64_t step) const { drills_.stall(step); }
  // Before the first step (each once, when sizing asks): the memory probe, then the time probe.
  void probe(const data::Batch& slab, std::int64_t step);

  // Step `step` (the count of steps done) at this rank's slab: attempts until one fits, then the
  // update. An abandoned outcome (a stop signal between micro-batches) has no update.
  struct Taken {
    StepOutcome outcome;
    OptimizerUpdate update;
    std::int64_t retries = 0;  // attempts that ran out of memory, and their time
    double retry_seconds = 0;
  };
  Taken take(const data::Batch& slab, std::int64_t step);

  // What it measured: every rank's largest peak so far, this step's time in the reduction
  // (this rank's own), the compute its time fit predicted for its last cut (0: no fit).
  const std::vector<std::int64_t>& peak_bytes() const { return peak_bytes_; }
  double reduce_seconds() const { return exchange_.seconds(); }
  double predicted_compute() const { return predicted_compute_; }
  struct Counts {
    std::int64_t oom_events = 0;      // ranks that ran out, over every agreed out-of-memory
    std::int64_t skipped_steps = 0;   // steps skipped for non-finite values
    std::int64_t overflow_steps = 0;  // fp16 steps skipped for an overflow
  };
  const Counts& counts() const { return counts_; }

 private:
  // What one attempt has computed so far on this rank.
  struct AttemptProgress {
    AttemptPhase phase = AttemptPhase::kBuffers;  // where it is (where it ran out)
    bool out_of_memory = false;
    bool abandoned = false;  // a stop signal came between two micro-batches
    // The memory model's measurement: the micro-batch with the highest peak (each micro-batch's
    // peak measured alone), or the one that ran out.
    std::int64_t peak = 0;
    MicroBatchShape peak_shape, shape;
    // The summed loss stays a tensor until after the reduction: no host synchronisation per
    // micro-batch (it matters on a GPU).
    at::Tensor loss, weight;
  };
  void run_memory_probe(const data::Batch& slab);
  void run_time_probe(const data::Batch& slab);
  StepOutcome attempt_until_it_fits(const data::Batch& slab, Taken& taken);
  void after_out_of_memory(const StepOutcome& outcome);
  OptimizerUpdate update_parameters(const StepOutcome& outcome);
  // One attempt at the batch; a probe (ProbePiece, sizing/memory_probe.hpp) runs one micro-batch
  // of the attempt's plan and always rolls back.
  StepOutcome attempt(const data::Batch& slab, std::int64_t m,
                      ProbePiece probe = ProbePiece::kNone);
  data::MicroBatchPlan plan_attempt(const data::Batch& slab, std::int64_t m, ProbePiece probe,
                                    RankReport& report);
  void run_pieces(const data::Batch& slab, const data::MicroBatchPlan& cut, bool probing,
                  AttemptProgress& progress);
  void run_micro_batch(const data::Batch& slab, const data::MicroBatchPiece& piece, bool first,
                       bool last, bool probing, AttemptProgress& progress);
  Objective::Terms forward_terms(const std::vector<at::Tensor>& inputs, const at::Tensor& target,
                                 std::int64_t rows, AttemptPhase& phase);
  void refuse_or_rethrow(const std::exception& e, AttemptPhase phase);
  StepOutcome reduce_and_agree(const RankReport& report, const AttemptProgress& progress);
  void take_mean(const StepOutcome& outcome);

  const TrainOptions& options_;
  comm::Communicator& comm_;
  int rank_, world_;
  const DeviceContext& context_;
  Model& model_;
  ModelState& model_state_;
  const Objective& objective_;
  OptimizerStep& optimizer_;
  const Schedule& schedule_;
  LossScale& loss_scale_;
  GradientExchange& exchange_;
  Sizing& sizing_;
  const DataFeed& feed_;
  Reporter& reporter_;

  Drills drills_;  // --inject-oom, -overflow, -slow, -stall on this rank
  ControlLayout control_;
  std::vector<float> control_values_;  // host copy of the control region
  std::int64_t step_ = 0;              // the step being taken (the count of steps done)
  std::vector<std::int64_t> peak_bytes_;
  double predicted_compute_ = 0;
  Counts counts_;
};

}  // namespace autoaccum::train
