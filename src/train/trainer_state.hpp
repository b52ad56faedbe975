// Trainer::State: what the rooms of src/train still share (private to src/train; the public
// face is autoaccum/train/trainer.hpp). The loop is in step/trainer.cpp, setup in
// run/trainer_setup.cpp, checkpoints and resuming in run/trainer_checkpoint.cpp. The data feed
// and sizing (sizing/data_feed.hpp, sizing/sizing.hpp) and the gradient exchange
// (reduce/gradient_exchange.hpp) are their rooms' own (src/train/README.md).
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/core/output_lock.hpp"
#include "autoaccum/data/batch_plan.hpp"
#include "autoaccum/data/micro_batch_plan.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/io/checkpoint.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/model/model_state.hpp"
#include "autoaccum/train/model/objective.hpp"
#include "autoaccum/train/reduce/gradient_exchange.hpp"
#include "autoaccum/train/reduce/reducer.hpp"
#include "autoaccum/train/sizing/data_feed.hpp"
#include "autoaccum/train/sizing/events.hpp"
#include "autoaccum/train/sizing/sizing.hpp"
#include "autoaccum/train/sizing/time_model.hpp"
#include "autoaccum/train/step/drills.hpp"
#include "autoaccum/train/step/loss_scale.hpp"
#include "autoaccum/train/step/optimizer_step.hpp"
#include "autoaccum/train/step/reporter.hpp"
#include "autoaccum/train/step/schedule.hpp"
#include "autoaccum/train/step/step_agreement.hpp"
#include "autoaccum/train/trainer.hpp"

#include "run/optimizer_checkpoint.hpp"

namespace autoaccum::train {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The device the model runs on and the communicator its gradients travel through. --device
// cuda: the model, micro-batches and the reduce buffer live on this rank's GPU and the buffer
// goes through NCCL; the control plane stays on MPI.
struct DeviceContext {
  bool use_cuda = false;
  c10::Device device{c10::kCPU};
  std::unique_ptr<comm::Communicator> gradient_comm;
  at::Tensor on_device(const at::Tensor& t) const {
    return use_cuda ? t.to(device, /*non_blocking=*/true) : t;  // CPU: the view itself
  }
};

// A step's times, for its run-log row: when it began, its wait for data and the reader's CPU
// time, and the out-of-memory retries it spent.
struct StepTimes {
  Clock::time_point start;
  double data_wait = 0, data_cpu = 0;
  std::int64_t retries = 0;
  double retry_seconds = 0;
};

// What the optimizer did with a step's gradients.
struct OptimizerUpdate {
  double lr = 0;
  double loss_scale = 1;  // the fp16 loss scale the step ran at
  bool skipped = false;   // non-finite values or an fp16 overflow
};

struct Trainer::State {
  TrainOptions options;
  comm::Communicator& comm;
  int rank = 0;
  int world = 1;
  bool root = false;
  std::string thread_source;  // where the thread count came from, for the banner
  // Rank 0's probe: how many times faster this device's matrix products run in the lower
  // precision (bf16, or fp16 for --precision fp16) than in fp32; 0 when not probed.
  double lower_gemm_speedup = 0;
  std::string gemm_probe_failure;  // why the probe failed, if it did
  void probe_precision();
  // --precision fp16's dynamic loss scale (disabled otherwise: value 1).
  LossScale loss_scale{false};
  DeviceContext context;
  comm::Communicator& reduce_comm() {
    return context.gradient_comm ? *context.gradient_comm : comm;
  }

  // The data: readers, plan, steps, every rank's share and each step's split.
  DataFeed feed;
  // The file resumed from, and why newer ones were passed over (rank 0; for the run log).
  std::string resumed_from;
  std::vector<std::string> resume_skipped;
  std::optional<Objective> objective;  // chosen from the training data's targets

  // Model and what a step changes.
  std::unique_ptr<Model> model;
  ParameterSet parameters;
  std::unique_ptr<ModelState> model_state;
  std::unique_ptr<OptimizerStep> optimizer;
  // Its state in checkpoints, per parameter, from whichever rank holds it (set up with the
  // reducer, in allocate_step_state).
  std::unique_ptr<OptimizerCheckpoint> optimizer_checkpoint;
  Schedule schedule;
  // Every rank's micro-batch policy, memory limit and memory model, the probes' outcomes
  // (sizing/sizing.hpp). The step drives its probes (step/probes.cpp).
  Sizing sizing;
  void run_memory_probe(const data::Batch& slab);
  void run_time_probe(const data::Batch& slab);
  // This rank's last attempt: the compute its time fit predicted for its cut (0: no fit).
  double predicted_compute = 0;
  Drills drills;                     // --inject-oom, -overflow, -slow, -stall on this rank

  // How gradients, buffer changes and the control table travel (reduce/gradient_exchange.hpp),
  // and the control table the step writes into it and agrees from.
  std::unique_ptr<GradientExchange> exchange;
  ControlLayout control;
  std::vector<float> control_values;  // host copy of the control region
  bool sharded() const { return exchange && exchange->sharded(); }

  std::int64_t step = 0;              // optimizer steps completed
  std::int64_t checkpoint_step = -1;  // the step of the last checkpoint written or resumed from
  std::vector<std::unique_ptr<OutputLock>> locks;
  std::vector<std::int64_t> peak_bytes;  // per rank, largest seen
  Reporter reporter;                     // the observers run/ opens, and what is said to them
  TrainResult result;

  State(const TrainOptions& o, comm::Communicator& c)
      : options(o), comm(c), feed(options, c.rank(), c.size()), sizing(options, c, feed) {}

  // Setup, in order; each piece is collective and leaves every rank agreeing.
  void setup();
  void choose_device();
  void start_loss_scale();  // fp16: the scale's start from what a rank's share counts
  void open_data();
  void build_model();
  void take_outputs();
  void trial();
  void run_trial(const data::Batch& rows);
  void allocate_step_state();
  void resume();
  std::optional<io::LoadedCheckpoint> load_checkpoint();
  void set_damaged_aside(const io::LoadedCheckpoint& loaded);
  void open_observers();
  io::ResumeRow resume_row() const;
  io::RunLogHeader run_log_header() const;
  std::string sizes_text_for_banner() const;
  void announce();

  // Where the run is, for a collective timeout's message: the step and the last checkpoint.
  std::string watchdog_context() const;
  bool documents() const { return feed.documents(); }  // rows are documents, sizes tokens
  // One attempt at the batch; a probe (ProbePiece, sizing/memory_probe.hpp) runs one micro-batch
  // of the attempt's plan and always rolls back.
  StepOutcome attempt(const data::Batch& slab, std::int64_t m,
                      ProbePiece probe = ProbePiece::kNone);
  // What one attempt has computed so far on this rank.
  struct AttemptProgress {
    AttemptPhase phase = AttemptPhase::kBuffers;  // where it is (where it ran out)
    bool out_of_memory = false;
    bool abandoned = false;  // a stop signal came between two micro-batches
    // The memory model's measurement: the micro-batch with the highest peak (each micro-batch's
    // peak measured alone), or the one that ran out.
    std::int64_t peak = 0;
    MicroBatchShape peak_shape, shape;
    // The summed loss stays a tensor until after the all-reduce: no host synchronisation per
    // micro-batch (it matters on a GPU).
    at::Tensor loss, weight;
  };
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
  // The step loop's parts (step/trainer.cpp).
  void take_mean(const StepOutcome& outcome);
  TrainResult end_dry_run();
  TrainResult end_run(double last_loss);
  StepOutcome attempt_until_it_fits(const data::Batch& slab, StepTimes& times);
  // After an agreed out-of-memory: sizing lowers the sizes; the event told, and the run ended
  // in one line when nothing can shrink.
  void after_out_of_memory(const StepOutcome& outcome);
  OptimizerUpdate update_parameters(const StepOutcome& outcome);
  void report_step(const StepOutcome& outcome, const OptimizerUpdate& update,
                   const StepTimes& times, const StepSplit& split);
  io::StepRow step_row(const StepOutcome& outcome, const OptimizerUpdate& update,
                       const StepTimes& times, const RankFigures& figures) const;
  void evaluate();
  // A stop signal was agreed on: checkpoint, status "preempted", one line (`where` adds detail).
  void stop_for_signal(const std::string& where);
  void save_checkpoint();
  // Rank 0: the checkpoint file itself, given every rank's random streams and fingerprints.
  std::int64_t write_checkpoint_file(std::vector<std::string> generators,
                                     std::vector<std::string> fingerprints);
  void restore(const io::Checkpoint& checkpoint);
  std::string restore_model(const io::Checkpoint& checkpoint);
  void restore_shares(const io::Checkpoint& checkpoint, const std::vector<std::int64_t>& saved);
  std::vector<std::string> gather_generator_states();
  std::vector<std::string> gather_replica_fingerprints();
  bool replicas_differ_said = false;

  // The run's end, told to the observers once, with this rank's last micro-batch.
  void finish(const std::string& status, const std::string& message = "") {
    reporter.finish(status, message, sizing.started() ? sizing.micro_batches().current(rank) : 0);
  }
  [[noreturn]] void fail_run(const std::string& message, ExitCode code) {
    finish("failed", message);
    throw CollectiveError(message, code, 0);
  }
  std::string balance_text() const {
    return options.balance ? "throughput, every " + std::to_string(options.balance_every) + " steps"
                           : std::string("none");
  }
  std::string model_name() const {
    return options.model_file.empty() ? "--model " + model->describe()
                                      : "--model-file '" + options.model_file + "'";
  }

  // Declared last, so destroyed first: takes back the watchdog's last words, which point here.
  struct WatchdogRelease {
    WatchdogRelease() = default;
    WatchdogRelease(const WatchdogRelease&) = delete;
    WatchdogRelease& operator=(const WatchdogRelease&) = delete;
    ~WatchdogRelease();
  } watchdog_release;
};

}  // namespace autoaccum::train
