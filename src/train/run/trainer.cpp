// Trainer: the run's loop. Read a slab, take the step (step/step_runner.hpp: attempts, the
// reduction, the agreement, the update), tell the observers its run-log row; evaluation,
// checkpoints and stop signals at their cadence (docs/design.md). Setup is in
// run/trainer_setup.cpp, checkpoints and resume in run/trainer_checkpoint.cpp.
#include "autoaccum/train/trainer.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>

#include "autoaccum/comm/watchdog.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/data/prefetcher.hpp"
#include "autoaccum/io/run_log.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/step/reporter.hpp"
#include "autoaccum/train/step/step_runner.hpp"

#include "run_state.hpp"

namespace autoaccum::train {

void Trainer::State::stop_for_signal(const std::string& where) {
  save_checkpoint();
  finish("preempted");
  reporter.say("autoaccum: stopped by a signal at step " + std::to_string(step) + where +
               (options.checkpoint.empty()
                    ? std::string(" (no --checkpoint given: progress is lost)")
                    : "; checkpoint written to " + options.checkpoint));
  result.preempted = true;
}

Trainer::Trainer(const TrainOptions& options, comm::Communicator& comm)
    : state_(std::make_unique<State>(options, comm)) {
  state_->setup();
}

Trainer::~Trainer() = default;

Model& Trainer::model() {
  return state_->bundle->model();
}

at::Tensor Trainer::last_gradient() const {
  if (state_->sharded())
    throw Error("last_gradient: under --shard a rank holds only its slice of the sum");
  // In parameter order (the buffer holds them in reverse).
  std::vector<at::Tensor> flat;
  for (const auto& p : state_->bundle->parameters().trainable)
    flat.push_back(p.grad().reshape(-1));
  return flat.empty() ? at::zeros({0}) : at::cat(flat);
}

TrainResult Trainer::run() {
  try {
    return run_steps();
  } catch (const CollectiveError& e) {
    state_->finish("failed", e.what());  // every rank threw it; only rank 0 has the log
    throw;
  } catch (const CollectiveTimeout& e) {
    state_->finish("failed", e.what());  // rank 0 writes it, if rank 0 is among those waiting
    throw;
  }
}

TrainResult Trainer::run_steps() {
  State& s = *state_;
  const auto& o = s.options;
  data::Prefetcher prefetcher(
      [&s](std::int64_t global_step) { return s.feed.read_rank_rows(global_step); }, s.step,
      s.feed.total_steps());
  double last_loss = 0;

  comm::Watchdog& dog = comm::watchdog();
  while (s.step < s.feed.total_steps()) {
    dog.set_context(s.watchdog_context());
    s.runner->stall(s.step);
    // Read the slab.
    StepTimes times;
    times.start = Clock::now();
    const double waited_before = prefetcher.waited_seconds();
    const data::Batch slab = prefetcher.next();
    times.data_wait = prefetcher.waited_seconds() - waited_before;
    // Before the first step only: the memory probe (--micro-batch-search predict), then the
    // time probe (documents with --micro-batch-cost auto).
    s.runner->probe(slab, s.step);
    // --balance throughput: automatic sizes follow changed shares.
    if (const auto line = s.sizing.follow_shares(s.step)) s.reporter.say(*line);
    if (o.dry_run) return s.end_dry_run();

    // Attempt, reduce, agree (retrying smaller after an agreed out-of-memory), update.
    const StepRunner::Taken taken = s.runner->take(slab, s.step);
    const StepOutcome& outcome = taken.outcome;
    times.retries = taken.retries;
    times.retry_seconds = taken.retry_seconds;
    if (outcome.abandoned) {
      // A stop signal came between micro-batches: this step is not taken (its partial gradient
      // is dropped; buffers and random state were restored), the checkpoint holds the state
      // before it, and a resumed run computes it whole.
      s.stop_for_signal(" (in step " + std::to_string(s.step + 1) +
                        ", between micro-batches: that step is dropped and computed again on "
                        "resume)");
      break;
    }

    // Tell the observers.
    const StepSplit split = s.feed.split_of(s.step);
    ++s.step;
    last_loss = outcome.loss;
    times.data_cpu = prefetcher.last_cpu_seconds();
    s.report_step(outcome, taken.update, times, split);
    if (s.after_step(outcome, split)) break;  // a stop signal
  }

  return s.end_run(last_loss);
}

// After a step is told: the shares measured (--balance), then at their cadence evaluation and
// checkpoints, a stop signal's checkpoint (true: the loop ends), and which ranks try a larger size.
bool Trainer::State::after_step(const StepOutcome& outcome, const StepSplit& split) {
  // Speeds in what the split divides: rows, or the step's tokens for documents.
  if (options.balance) {
    const auto line =
        sizing.rebalance(step, documents() ? split.tokens : split.rows, outcome.compute_seconds);
    if (line) reporter.say(*line);
  }
  if (step >= feed.total_steps()) return false;  // the last: end_run checkpoints and evaluates
  if (options.eval_every > 0 && step % options.eval_every == 0) evaluate();
  if (options.checkpoint_every > 0 && step % options.checkpoint_every == 0) save_checkpoint();
  if (outcome.stop) {
    stop_for_signal("");
    return true;
  }
  for (const std::string& line : sizing.after_success(step))
    reporter.say(line);
  return false;
}

// --dry-run: what fits is all it reports; nothing trains, nothing is written.
TrainResult Trainer::State::end_dry_run() {
  for (const std::string& line : sizing.dry_run_lines())
    reporter.say(line);
  result.steps_done = 0;
  take_counts();
  reporter.close();
  return result;
}

// What the step counted: out-of-memory events, skipped and overflowed steps.
void Trainer::State::take_counts() {
  if (!runner) return;
  result.oom_events = runner->counts().oom_events;
  result.skipped_steps = runner->counts().skipped_steps;
  result.overflow_steps = runner->counts().overflow_steps;
}

// The last checkpoint and evaluation (unless a signal stopped the run), and the result.
TrainResult Trainer::State::end_run(double last_loss) {
  if (!result.preempted) {
    comm::watchdog().set_context(watchdog_context());
    save_checkpoint();  // first: an evaluation that fails must not cost the trained model
    evaluate();
    finish("completed");
  }
  result.steps_done = step;
  take_counts();
  result.final_micro_batch = sizing.micro_batches().current(rank);
  result.final_micro_batches = sizing.micro_batches().sizes();
  result.final_loss = last_loss;
  return result;
}

// The finished step (`step` already counts it) to every observer: its run-log row and every
// rank's figures.
void Trainer::State::report_step(const StepOutcome& outcome, const OptimizerUpdate& update,
                                 const StepTimes& times, const StepSplit& split) {
  RankFigures figures;
  // Every rank's micro-batches: the pieces each reported for documents, ceil(rows / size) for
  // rows. Rank 0's is the row's `accumulation`; the most, and who ran it, is what the step
  // waited on.
  for (int r = 0; r < world; ++r) {
    const auto i = static_cast<std::size_t>(r);
    figures.accumulation.push_back(
        documents() ? outcome.pieces[i] : sizing.micro_batches().accumulation(r, split.rows[i]));
  }
  figures.peak_bytes = runner->peak_bytes();
  figures.micro_batches = sizing.micro_batches().sizes();
  figures.rows = split.rows;
  figures.documents = documents();
  const io::StepRow row = step_row(outcome, update, times, figures);
  reporter.notify([&](StepObserver& observer) { observer.on_step(row, figures); });
}

io::StepRow Trainer::State::step_row(const StepOutcome& outcome, const OptimizerUpdate& update,
                                     const StepTimes& times, const RankFigures& figures) const {
  const double step_seconds = seconds_since(times.start);
  io::StepRow row;
  row.step = step - 1;
  row.epoch = feed.position(step - 1).epoch;
  row.micro_batch = sizing.micro_batches().current(0);
  const auto most = std::max_element(figures.accumulation.begin(), figures.accumulation.end());
  row.accumulation = figures.accumulation.front();
  row.accumulation_max = *most;  // max_element: the first, so the lowest such rank
  row.accumulation_max_rank = static_cast<std::int64_t>(most - figures.accumulation.begin());
  if (documents()) {
    // Every rank's plan as it reported it in the attempt that succeeded.
    row.tokens = std::accumulate(outcome.tokens.begin(), outcome.tokens.end(), std::int64_t{0});
    row.padded_tokens = std::accumulate(outcome.padded_tokens.begin(), outcome.padded_tokens.end(),
                                        std::int64_t{0});
  }
  row.compute_seconds = outcome.compute_seconds.empty() ? 0.0 : outcome.compute_seconds.front();
  row.predicted_compute_seconds = runner->predicted_compute();  // rank 0's, which writes the log
  row.loss = outcome.loss;
  row.lr = update.lr;
  row.loss_scale = update.loss_scale;
  row.step_seconds = step_seconds;
  row.samples_per_second = static_cast<double>(std::accumulate(
                               figures.rows.begin(), figures.rows.end(), std::int64_t{0})) /
                           step_seconds;
  row.oom_retries = times.retries;
  row.skipped = update.skipped ? 1 : 0;
  row.data_wait_seconds = times.data_wait;
  row.data_cpu_seconds = times.data_cpu;
  row.peak_bytes = *std::max_element(runner->peak_bytes().begin(), runner->peak_bytes().end());
  row.live_bytes = memory::live_bytes();
  row.allreduce_seconds = runner->reduce_seconds();
  row.retry_seconds = times.retry_seconds;
  return row;
}

}  // namespace autoaccum::train
