// Trainer::State: the run, private to run/ (the public face is autoaccum/train/trainer.hpp). It
// owns the rooms a run is made of, built in order by set-up (run/trainer_setup.cpp): the device,
// the data feed and sizing (sizing/), the model, its state and objective (model/), the gradient
// exchange (reduce/), the optimizer and the step runner (step/), and the observers. The loop and
// its cadence (evaluation, checkpoints, signals, the run-log row) are in run/trainer.cpp,
// checkpoints and resuming in run/trainer_checkpoint.cpp, where each room records and restores
// its part (src/train/README.md).
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
#include "autoaccum/train/model/device_context.hpp"
#include "autoaccum/train/model/model_bundle.hpp"
#include "autoaccum/train/reduce/gradient_exchange.hpp"
#include "autoaccum/train/reduce/reducer.hpp"
#include "autoaccum/train/sizing/data_feed.hpp"
#include "autoaccum/train/sizing/events.hpp"
#include "autoaccum/train/sizing/sizing.hpp"
#include "autoaccum/train/sizing/time_model.hpp"
#include "autoaccum/train/step/loss_scale.hpp"
#include "autoaccum/train/step/optimizer_step.hpp"
#include "autoaccum/train/step/reporter.hpp"
#include "autoaccum/train/step/schedule.hpp"
#include "autoaccum/train/step/step_agreement.hpp"
#include "autoaccum/train/step/step_runner.hpp"
#include "autoaccum/train/trainer.hpp"

#include "optimizer_checkpoint.hpp"

namespace autoaccum::train {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A step's times, for its run-log row: when it began, its wait for data and the reader's CPU
// time, and the out-of-memory retries it spent.
struct StepTimes {
  Clock::time_point start;
  double data_wait = 0, data_cpu = 0;
  std::int64_t retries = 0;
  double retry_seconds = 0;
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

  // The model, its objective, parameters and attempt state (model/model_bundle.hpp).
  std::unique_ptr<ModelBundle> bundle;
  std::unique_ptr<OptimizerStep> optimizer;
  // Its state in checkpoints, per parameter, from whichever rank holds it (set up with the
  // reducer, in allocate_step_state).
  std::unique_ptr<OptimizerCheckpoint> optimizer_checkpoint;
  Schedule schedule;
  // Every rank's micro-batch policy, memory limit and memory model, the probes' outcomes
  // (sizing/sizing.hpp).
  Sizing sizing;
  // How gradients, buffer changes and the control table travel (reduce/gradient_exchange.hpp).
  std::unique_ptr<GradientExchange> exchange;
  bool sharded() const { return exchange && exchange->sharded(); }
  // One step at a batch, and the probes before the first (step/step_runner.hpp); made last in
  // set-up, from the rooms above.
  std::unique_ptr<StepRunner> runner;

  std::int64_t step = 0;              // optimizer steps completed
  std::int64_t checkpoint_step = -1;  // the step of the last checkpoint written or resumed from
  std::vector<std::unique_ptr<OutputLock>> locks;
  Reporter reporter;  // the observers run/ opens, and what is said to them
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
  // The loop's parts (run/trainer.cpp).
  TrainResult end_dry_run();
  TrainResult end_run(double last_loss);
  void take_counts();
  bool after_step(const StepOutcome& outcome, const StepSplit& split);
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
    return options.model_file.empty() ? "--model " + bundle->model().describe()
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
