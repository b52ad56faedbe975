// Trainer::State: what the rooms of src/train share (private to src/train; the public
// face is autoaccum/train/trainer.hpp). The loop is in step/trainer.cpp, setup in
// run/trainer_setup.cpp, the data and each step's split in sizing/trainer_data.cpp, memory
// limits, models and what follows an out-of-memory in sizing/trainer_memory.cpp, the reduce
// path's set-up (--overlap) in reduce/trainer_overlap.cpp, checkpoints and resuming in
// run/trainer_checkpoint.cpp (src/train/README.md).
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
#include "autoaccum/train/reduce/bucketed_reduce.hpp"
#include "autoaccum/train/reduce/reduce_buffer.hpp"
#include "autoaccum/train/reduce/reducer.hpp"
#include "autoaccum/train/sizing/balance.hpp"
#include "autoaccum/train/sizing/cut_costs.hpp"
#include "autoaccum/train/sizing/events.hpp"
#include "autoaccum/train/sizing/memory_limits.hpp"
#include "autoaccum/train/sizing/memory_model.hpp"
#include "autoaccum/train/sizing/memory_probe.hpp"
#include "autoaccum/train/sizing/micro_batch.hpp"
#include "autoaccum/train/sizing/refusals.hpp"
#include "autoaccum/train/sizing/time_model.hpp"
#include "autoaccum/train/sizing/time_probe.hpp"
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

  // Data.
  std::vector<std::string> data_paths, val_data_paths;  // --data and --val-data, globs expanded
  std::unique_ptr<data::SlabReader> reader;
  std::unique_ptr<data::SlabReader> val_reader;
  std::unique_ptr<data::BatchPlan> plan;
  io::DataOrder data_order;  // what decides the rows of each step (checked on --resume)
  std::int64_t total_steps = 0;
  // Where epochs are counted from: step `epoch_origin_step` starts epoch `epoch_origin` (0 and
  // 0, or a checkpoint's epoch start, which after --resume-reshape is a step no longer a
  // multiple of the batches per epoch).
  std::int64_t epoch_origin_step = 0, epoch_origin = 0;
  struct Position {
    std::int64_t epoch, batch;  // the epoch and the batch within it
  };
  Position position(std::int64_t global_step) const;
  // The steps --steps or --epochs ask for, counted from the epoch origin.
  std::int64_t steps_wanted() const;
  bool reshaped = false;  // --resume-reshape changed the data order at the checkpoint
  // The file resumed from, and why newer ones were passed over (rank 0; for the run log).
  std::string resumed_from;
  std::vector<std::string> resume_skipped;
  std::optional<Objective> objective;

  // Model and what a step changes.
  std::unique_ptr<Model> model;
  ParameterSet parameters;
  std::unique_ptr<ModelState> model_state;
  std::unique_ptr<OptimizerStep> optimizer;
  // Its state in checkpoints, per parameter, from whichever rank holds it (set up with the
  // reducer, in allocate_step_state).
  std::unique_ptr<OptimizerCheckpoint> optimizer_checkpoint;
  Schedule schedule;
  std::unique_ptr<RankMicroBatches> micro_batches;  // every rank's micro-batch
  // What every rank's micro-batch policy is made from (rows, or token budgets for documents):
  // the starting size and cap, the fixed size if any, and the floor halving stops at.
  std::int64_t size_cap = 1, size_floor = 1;
  std::optional<std::int64_t> fixed_size;
  // `resumed`: sizes a checkpoint recorded (then no probe: the run continues at them).
  void make_micro_batches(const std::vector<std::int64_t>& resumed) {
    // --micro-batch-search predict with a limit to predict against: probe before the first
    // step (a prediction that does not fit then halves, as halve does).
    // --dry-run probes whenever it can: what fits is all it reports.
    predict_pending = ((options.predict_micro_batch && !fixed_size) || options.dry_run) &&
                      limits.known() && resumed.empty();
    // --micro-batch-cost auto: the time probe after it, whatever the budget (a resume on the same
    // ranks takes the fits from its checkpoint instead: restore clears this).
    time_pending = documents() && !options.dry_run &&
                   options.micro_batch_cost == TrainOptions::MicroBatchCost::kAuto;
    micro_batches = std::make_unique<RankMicroBatches>(world, size_cap, fixed_size, resumed,
                                                       options.refine_micro_batch,
                                                       options.micro_batch_per_rank, size_floor);
    micro_batches->set_regrow(regrow_steps());
  }
  std::int64_t regrow_steps() const {
    if (options.micro_batch_regrow >= 0) return options.micro_batch_regrow;
    return options.predict_micro_batch ? 100 : 0;
  }
  // Memory (trainer_memory.cpp): each rank's limit and memory model, held by every rank and fed
  // by every attempt's agreed measurements.
  MemoryLimits limits;
  std::vector<MemoryModel> memory_models;
  bool predict_pending = false;  // the probe is still to run before the first step
  void gather_limits();
  void learn_memory(const StepOutcome& outcome);
  // The memory probe, before the first step (the step drives it: run_memory_probe).
  MemoryProbe::Setup memory_probe_setup() const;
  [[noreturn]] void fail_nothing_fits(const MemoryProbe& probe, const AttemptOutcome& outcome);
  std::int64_t predicted_size(const MemoryProbe& probe, int r, MemoryPrediction::Rank& line) const;
  void start_from_probe(const MemoryProbe& probe, double seconds);
  void run_memory_probe(const data::Batch& slab);
  std::optional<MemoryPrediction> prediction;  // the probe's, once it ran
  // Documents: the width costs (--token-cost memory) and time fits (--micro-batch-cost auto)
  // every rank's cut weighs (sizing/cut_costs.hpp).
  CutCosts costs;
  bool time_pending = false;  // the time probe is still to run before the first step
  void run_time_probe(const data::Batch& slab);
  void fit_times(const TimeProbeSchedule& probe, double seconds);
  void predict_steps(int r, TimeProbe::Rank& line) const;
  // This rank's last attempt: the compute its time fit predicted for its cut (0: no fit).
  double predicted_compute = 0;
  // How documents are cut, for the banner and the run log: "by fewest pieces", "by predicted
  // time (auto: ...)", "by predicted time (fixed=F,width=X)"; rows: "".
  std::string micro_batch_cost_text() const;
  void report_dry_run();
  // --balance throughput, rows, automatic micro-batch: each rank's size follows its share, as
  // far as its memory model says it fits.
  void follow_shares();
  bool sizes_follow_shares() const {
    return options.balance && !documents() && micro_batches->automatic();
  }
  std::unique_ptr<Balance> balance;  // every rank's share of each step's batch
  Drills drills;                     // --inject-oom, -overflow, -slow, -stall on this rank

  // The one all-reduced buffer and its regions.
  std::unique_ptr<ReduceBuffer> reduce;
  ReduceLayout::Handle gradient_region = 0, buffer_region = 0, control_region = 0;
  ControlLayout control;
  std::vector<float> control_values;  // host copy of the control region
  bool checked_views = false;
  double allreduce_seconds = 0;  // this step's time in the all-reduce (rank's own; exposed)
  // --overlap on: the gradient region in buckets, sent during the last backward pass; null when
  // off (one collective after it). Declared after `reduce`: its thread writes into that buffer.
  std::unique_ptr<BucketedReduce> bucketed;
  // The step's one collective, whichever it is (plain, bucketed, sharded): what attempt() and
  // the step call. Declared after what it refers to. `reduce` and `bucketed` are null when
  // sharded (--shard optimizer on more than one rank).
  std::unique_ptr<Reducer> reducer;
  bool sharded() const { return options.shard == "optimizer" && world > 1; }
  // Each rank's fixed bytes (FixedBytes::total, frozen parameters included), sharded or not,
  // and the line that compares them ("fixed bytes per rank: ...").
  std::vector<std::int64_t> fixed_bytes(bool sharded_state) const;
  std::string fixed_bytes_text() const;
  std::atomic<bool> inject_in_backward{false};  // --inject-oom backward=1: throw in this backward
  std::shared_ptr<torch::autograd::Node> injection_accumulator;  // holds its hook
  void install_backward_injection();
  void choose_overlap(const std::vector<at::Tensor>& bound);
  std::size_t node_count() const;  // distinct hosts among the ranks
  std::string overlap_text() const;

  std::int64_t step = 0;              // optimizer steps completed
  std::int64_t checkpoint_step = -1;  // the step of the last checkpoint written or resumed from
  std::vector<std::unique_ptr<OutputLock>> locks;
  std::vector<std::int64_t> peak_bytes;  // per rank, largest seen
  Reporter reporter;                     // the observers run/ opens, and what is said to them
  TrainResult result;

  State(const TrainOptions& o, comm::Communicator& c)
      : options(o), comm(c), limits(o.memory_limit, o.memory_limits) {}

  // Setup, in order; each piece is collective and leaves every rank agreeing.
  void setup();
  void choose_device();
  void start_loss_scale();  // fp16: the scale's start from what a rank's share counts
  void open_data();
  void open_validation();
  void make_plan();
  void choose_row_sizes();
  void choose_token_budgets();
  void build_model();
  void take_outputs();
  void trial();
  void run_trial(const data::Batch& rows);
  void allocate_step_state();
  void resume();
  std::optional<io::LoadedCheckpoint> load_checkpoint();
  void set_damaged_aside(const io::LoadedCheckpoint& loaded);
  io::DataOrder describe_data_order() const;
  void warn_about_slow_data() const;
  void open_observers();
  io::ResumeRow resume_row() const;
  io::RunLogHeader run_log_header() const;
  std::string sizes_text_for_banner() const;
  void announce();

  // Where the run is, for a collective timeout's message: the step and the last checkpoint.
  std::string watchdog_context() const;
  data::Batch read_rank_rows(std::int64_t global_step) const;
  // Document data (rows are documents; micro-batch sizes are token budgets).
  bool documents() const { return reader->schema().documents; }
  // A micro-batch size in its unit: "1 row", "64 rows", "512 tokens".
  std::string count_text(std::int64_t size) const {
    return std::to_string(size) + (documents() ? " token" : " row") + (size == 1 ? "" : "s");
  }
  // How step `global_step`'s global batch is split, computed once per use site: rank r's rows
  // are [batch.begin + offsets[r], batch.begin + offsets[r + 1]) (the schedule's split for
  // rows, near-equal or --balance-weighted tokens for documents); every rank can compute every
  // rank's, since the lengths and the shares are known everywhere.
  struct StepSplit {
    data::RowRange batch;
    std::vector<std::int64_t> offsets;  // [world + 1], into the batch
    std::vector<std::int64_t> rows;     // each rank's rows (documents)
    std::vector<std::int64_t> tokens;   // document data: each rank's tokens; empty for rows
  };
  StepSplit split_of(std::int64_t global_step) const;
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
  void after_out_of_memory(const StepOutcome& outcome);
  // The step loop's parts (step/trainer.cpp).
  void take_mean(const StepOutcome& outcome);
  TrainResult end_dry_run();
  TrainResult end_run(double last_loss);
  StepOutcome attempt_until_it_fits(const data::Batch& slab, StepTimes& times);
  OptimizerUpdate update_parameters(const StepOutcome& outcome);
  void report_step(const StepOutcome& outcome, const OptimizerUpdate& update,
                   const StepTimes& times, const StepSplit& split);
  io::StepRow step_row(const StepOutcome& outcome, const OptimizerUpdate& update,
                       const StepTimes& times, const RankFigures& figures) const;
  void announce_probes(const std::vector<int>& probing);
  // A size the model refuses (kRefused) ends the run on every rank with one line and exit 3
  // when the agreed outcome names a refusing rank (trainer_memory.cpp, with after_out_of_memory).
  Refusals refusals;
  void fail_if_refused(const StepOutcome& outcome);
  void rebalance(const std::vector<std::int64_t>& step_shares,
                 const std::vector<double>& compute_seconds);
  void evaluate();
  // A stop signal was agreed on: checkpoint, status "preempted", one line (`where` adds detail).
  void stop_for_signal(const std::string& where);
  void save_checkpoint();
  // Rank 0: the checkpoint file itself, given every rank's random streams and fingerprints.
  std::int64_t write_checkpoint_file(std::vector<std::string> generators,
                                     std::vector<std::string> fingerprints);
  void restore(const io::Checkpoint& checkpoint);
  std::string restore_model(const io::Checkpoint& checkpoint);
  std::vector<std::int64_t> restore_micro_batches(const io::Checkpoint& checkpoint);
  void restore_fits(const io::Checkpoint& checkpoint);
  void restore_shares(const io::Checkpoint& checkpoint, const std::vector<std::int64_t>& saved);
  std::vector<std::string> gather_generator_states();
  std::vector<std::string> gather_replica_fingerprints();
  bool replicas_differ_said = false;

  // The run's end, told to the observers once, with this rank's last micro-batch.
  void finish(const std::string& status, const std::string& message = "") {
    reporter.finish(status, message, micro_batches ? micro_batches->current(rank) : 0);
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
