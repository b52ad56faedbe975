// Trainer: the step loop. Read a slab, attempt it in micro-batches, reduce once, agree, then
// step or retry; observers, checkpoints and evaluation hang off the loop (docs/design.md).
// Setup is in run/trainer_setup.cpp, checkpoints and resume in run/trainer_checkpoint.cpp.
#include "autoaccum/train/trainer.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <limits>
#include <numeric>
#include <sstream>
#include <thread>
#include <tuple>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/comm/factory.hpp"
#include "autoaccum/comm/nccl_communicator.hpp"
#include "autoaccum/comm/watchdog.hpp"
#include "autoaccum/core/atomic_write.hpp"
#include "autoaccum/core/console.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/data/batch_plan.hpp"
#include "autoaccum/data/prefetcher.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/io/checkpoint.hpp"
#include "autoaccum/io/run_log.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/model/evaluation.hpp"
#include "autoaccum/train/model/model_state.hpp"
#include "autoaccum/train/model/objective.hpp"
#include "autoaccum/train/reduce/reducer.hpp"
#include "autoaccum/train/sizing/balance.hpp"
#include "autoaccum/train/sizing/micro_batch.hpp"
#include "autoaccum/train/step/optimizer_step.hpp"
#include "autoaccum/train/step/reporter.hpp"
#include "autoaccum/train/step/schedule.hpp"
#include "autoaccum/train/step/step_agreement.hpp"

#include "../trainer_state.hpp"

namespace autoaccum::train {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) {
  g_stop.store(true);
}

}  // namespace

void install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGUSR1, SIGTERM, SIGINT})
    sigaction(signal, &action, nullptr);
}
bool stop_requested() noexcept {
  return g_stop.load();
}

// One attempt at the current batch with micro-batch m. Every rank returns the same outcome: it
// comes from the reduced buffer. A failed attempt leaves buffers and random state as they were.
//
// A probe (run_memory_probe, run_time_probe) runs only one micro-batch of size m (none when m is
// 0) and always rolls back: it measures memory or time and changes nothing.
StepOutcome Trainer::State::attempt(const data::Batch& slab, std::int64_t m, ProbePiece probe) {
  exchange->reducer().begin();
  sizing.refusals().start(m);
  memory::reset_peak();
  const std::int64_t base_bytes = memory::live_bytes();
  const auto compute_start = Clock::now();
  memory::OomWatch watch;
  std::optional<AttemptGuard> guard;
  AttemptProgress progress;
  RankReport report;  // its plan's figures now; the outcome's after the micro-batches
  try {
    guard.emplace(*model_state);
    // Lower precision: each weight cast once for all the attempt's micro-batches.
    const CastCacheScope casts(options.precision);
    const data::MicroBatchPlan cut = plan_attempt(slab, m, probe, report);
    run_pieces(slab, cut, probe != ProbePiece::kNone, progress);
  } catch (const std::exception& e) {
    if (!watch.explains(e)) {
      refuse_or_rethrow(e, progress.phase);
      progress.phase = AttemptPhase::kRefused;
    }
    progress.out_of_memory = true;
    progress.loss = at::Tensor();
    progress.weight = at::Tensor();
    progress.peak_shape = progress.shape;
  }
  // The compute time is what --balance weighs and what the time model (--micro-batch-cost auto)
  // fits and is checked by: on a GPU, the kernels' time, not their launches' (one wait per
  // attempt, only then).
  if (context.use_cuda && !progress.out_of_memory &&
      (options.balance || options.micro_batch_cost == TrainOptions::MicroBatchCost::kAuto))
    memory::synchronize_device();
  report.out_of_memory = progress.out_of_memory;
  report.phase = progress.out_of_memory ? progress.phase : AttemptPhase::kNone;
  report.peak_bytes = std::max(progress.peak, memory::peak_bytes());
  report.stop_requested = stop_requested();
  report.abandoned = progress.abandoned;
  report.compute_seconds = seconds_since(compute_start);
  report.peak_shape = progress.peak_shape;
  report.base_bytes = base_bytes;
  StepOutcome outcome = reduce_and_agree(report, progress);
  if (probe != ProbePiece::kShortPiece) sizing.learn(outcome);
  if (outcome.succeeded() && probe == ProbePiece::kNone) {
    take_mean(outcome);
    guard->commit();
  }
  return outcome;  // otherwise the guard restores buffers and random state
}

// The mean over what the global batch counted, and the loss scale undone, in one pass; the
// buffers' mean change (BatchNorm statistics) applied.
void Trainer::State::take_mean(const StepOutcome& outcome) {
  const double divisor = (outcome.weight > 0 ? outcome.weight : 1.0) * loss_scale.value();
  if (divisor != 1.0) exchange->reducer().gradients().mul_(1.0 / divisor);
  model_state->apply_mean_change(exchange->reducer().part(Reducer::Part::kBuffers));
}

// The attempt's micro-batches in order, then the buffers' changes for the reduction.
void Trainer::State::run_pieces(const data::Batch& slab, const data::MicroBatchPlan& cut,
                                bool probing, AttemptProgress& progress) {
  for (const data::MicroBatchPiece& piece : cut.pieces) {
    // A stop signal ends the attempt between micro-batches, so a long step cannot outlast a
    // scheduler's grace time; the ranks agree in the attempt's collective to drop the step.
    if (stop_requested()) {
      progress.abandoned = true;
      break;
    }
    run_micro_batch(slab, piece, &piece == &cut.pieces.front(), &piece == &cut.pieces.back(),
                    probing, progress);
  }
  if (!progress.abandoned) {
    progress.phase = AttemptPhase::kBuffers;
    model_state->write_changes(exchange->reducer().part(Reducer::Part::kBuffers));
  }
  progress.phase = AttemptPhase::kNone;
}

// Which rows go together: slices of m rows, or documents under a budget of m tokens; a probe keeps
// one piece of that plan (ProbePiece). `report` takes the plan's figures, `predicted_compute` its
// predicted time.
data::MicroBatchPlan Trainer::State::plan_attempt(const data::Batch& slab, std::int64_t m,
                                                  ProbePiece probe, RankReport& report) {
  data::MicroBatchPlan cut;
  if (m > 0)
    cut = data::plan_micro_batches(slab, m, sizing.costs().width_cost(rank),
                                   sizing.costs().piece_cost(options, rank));
  report.pieces = static_cast<std::int64_t>(cut.pieces.size());
  report.tokens = cut.tokens;
  report.padded_tokens = cut.padded_tokens;
  predicted_compute = 0;
  if (const auto fit = sizing.costs().time_fit(rank); fit && probe == ProbePiece::kNone) {
    for (const data::MicroBatchPiece& piece : cut.pieces)
      predicted_compute += fit->predict(piece_shape(piece));
  }
  if (probe == ProbePiece::kNone || cut.pieces.empty()) return cut;
  if (probe == ProbePiece::kShortPiece) {
    cut.pieces.assign(1,
                      data::short_piece(slab, std::max<std::int64_t>(1, feed.sizes().floor / 8)));
    return cut;
  }
  std::optional<std::size_t> keep = std::size_t{0};
  if (probe == ProbePiece::kNarrowPiece) keep = data::narrow_piece(cut, m);
  if (keep && *keep > 0) cut.pieces.front() = std::move(cut.pieces[*keep]);
  cut.pieces.resize(keep ? 1 : 0);
  // Documents: the first piece measured at the data's longest width (the budget's floor).
  if (probe == ProbePiece::kFirstPiece && !cut.pieces.empty())
    data::widen_piece(slab, cut.pieces.front(), feed.sizes().floor, m);
  return cut;
}

// One micro-batch: forward, loss and backward; its gradient accumulates, its loss terms add to
// the attempt's. `first` and `last`: its place in the attempt (the overflow drill takes the first;
// --overlap sends the last one's gradients as backward completes them).
void Trainer::State::run_micro_batch(const data::Batch& slab, const data::MicroBatchPiece& piece,
                                     bool first, bool last, bool probing,
                                     AttemptProgress& progress) {
  const auto micro_start = Clock::now();
  progress.shape = piece_shape(piece);
  progress.peak = std::max(progress.peak, memory::peak_bytes());
  memory::reset_peak();
  const data::Batch micro = data::micro_batch(slab, piece);
  std::vector<at::Tensor> inputs;
  const std::size_t input_count = micro.size() - 1;  // the fields: inputs, then the target
  for (std::size_t i = 0; i < input_count; ++i)
    inputs.push_back(context.on_device(micro[i]));
  progress.phase = AttemptPhase::kForward;
  const at::Tensor target = context.on_device(micro[input_count]);
  // The gradient of the summed loss accumulates; it is divided once, after the all-reduce, by
  // what the whole global batch counted.
  const Objective::Terms terms = forward_terms(inputs, target, piece.size(), progress.phase);
  progress.phase = AttemptPhase::kBackward;
  at::Tensor scaled = terms.sum;
  if (loss_scale.enabled()) scaled = scaled * loss_scale.value();
  if (first && drills.overflow(step))
    scaled = scaled * std::numeric_limits<double>::infinity();  // --inject-overflow
  if (last)
    exchange->reducer().arm(scaled);  // --overlap: gradients go in buckets as backward makes them
  drills.arm_backward(piece.size(), step);  // --inject-oom ...,backward=1
  scaled.backward();
  // Summed in double: a rank's count of tokens may pass 2^24.
  const at::Tensor loss_term = terms.sum.detach().to(at::kDouble);
  const at::Tensor weight_term = terms.weight.to(at::kDouble);
  progress.loss = progress.loss.defined() ? progress.loss + loss_term : loss_term;
  progress.weight = progress.weight.defined() ? progress.weight + weight_term : weight_term;
  if (drills.slow()) {
    if (context.use_cuda) memory::synchronize_device();  // the device's work, not its launches
    drills.slow_down(micro_start);
  }
  exchange->check_views();
  // A probe's one piece is its shape whatever the peak (a short piece may peak below what the
  // attempt held before it): the time probe fits to it.
  if (memory::peak_bytes() >= progress.peak || probing) {
    progress.peak = std::max(progress.peak, memory::peak_bytes());
    progress.peak_shape = progress.shape;
  }
}

// Forward and loss under autocast (--precision; backward runs outside it, as in PyTorch): the
// objective's terms on the output, or the model's own (--loss model). `phase` moves to the loss.
Objective::Terms Trainer::State::forward_terms(const std::vector<at::Tensor>& inputs,
                                               const at::Tensor& target, std::int64_t rows,
                                               AttemptPhase& phase) {
  const AutocastScope autocast(options.precision, context.device.type());
  Objective::Terms terms;
  at::Tensor output;
  if (objective->from_model())
    std::tie(terms.sum, terms.weight) = model->forward_loss(inputs, target);
  else
    output = model->forward(inputs);
  // Injected after the forward pass, so the activations exist when it throws, as in a real OOM
  // late in forward; they must be released like a real one's.
  if (drills.out_of_memory(/*backward=*/false, rows, step)) {
    memory::throw_out_of_memory("injected out-of-memory (--inject-oom) at micro-batch " +
                                std::to_string(rows));
  }
  if (objective->from_model()) return terms;
  phase = AttemptPhase::kLoss;
  return objective->terms(output, target);
}

// Only an out-of-memory is agreed on in an attempt, and the model's own error (LibTorch's or the
// TorchScript code's, in forward, loss or backward) on a micro-batch smaller than one this rank
// tried before an out-of-memory lowered it: a size the model does not accept, such as
// BatchNorm's one row (recorded as the refusal). Anything else, autoaccum's own errors above all
// (internal ones, a model that returns the wrong kind of output), is this rank's own failure:
// rethrown (spmd_main aborts).
void Trainer::State::refuse_or_rethrow(const std::exception& e, AttemptPhase phase) {
  const bool from_the_model = dynamic_cast<const Error*>(&e) == nullptr &&
                              (phase == AttemptPhase::kForward || phase == AttemptPhase::kLoss ||
                               phase == AttemptPhase::kBackward);
  if (!sizing.refusals().take(e.what(), from_the_model)) throw;
}

// This rank's report and loss terms into the control region, the step's one reduction, and the
// outcome every rank agrees on from it.
StepOutcome Trainer::State::reduce_and_agree(const RankReport& report,
                                             const AttemptProgress& progress) {
  std::fill(control_values.begin(), control_values.end(), 0.0f);
  write_report(control, rank, report, control_values.data());
  at::Tensor slots = exchange->reducer().part(Reducer::Part::kControl);
  const auto control_count = static_cast<std::int64_t>(control_values.size());
  slots.copy_(at::from_blob(control_values.data(), {control_count}, at::kFloat));
  if (progress.loss.defined()) {
    // On the device, without a host synchronisation: the values' exact float pieces.
    const auto pieces = static_cast<std::int64_t>(comm::kExactSlots);
    slots.narrow(0, static_cast<std::int64_t>(control.loss(rank)), pieces)
        .copy_(exact_pieces(progress.loss));
    slots.narrow(0, static_cast<std::int64_t>(control.weight(rank)), pieces)
        .copy_(exact_pieces(progress.weight));
  }
  exchange->reduce();
  at::from_blob(control_values.data(), {control_count}, at::kFloat)
      .copy_(exchange->reducer().part(Reducer::Part::kControl));
  StepOutcome outcome = agree_on_step(control, control_values.data());
  if (!outcome.out_of_memory.empty()) sizing.refusals().saw_out_of_memory();
  for (int r = 0; r < world; ++r) {
    auto& peak = peak_bytes[static_cast<std::size_t>(r)];
    peak = std::max(peak, outcome.peak_bytes[static_cast<std::size_t>(r)]);
  }
  return outcome;
}

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
  return *state_->model;
}

at::Tensor Trainer::last_gradient() const {
  if (state_->sharded())
    throw Error("last_gradient: under --shard optimizer a rank holds only its slice of the sum");
  // In parameter order (the buffer holds them in reverse).
  std::vector<at::Tensor> flat;
  for (const auto& p : state_->parameters.trainable)
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
    s.drills.stall(s.step);
    // Read the slab.
    StepTimes times;
    times.start = Clock::now();
    const double waited_before = prefetcher.waited_seconds();
    const data::Batch slab = prefetcher.next();
    times.data_wait = prefetcher.waited_seconds() - waited_before;
    s.run_memory_probe(slab);  // before the first step only (--micro-batch-search predict)
    s.run_time_probe(slab);    // then, documents with --micro-batch-cost auto
    // --balance throughput: automatic sizes follow changed shares.
    if (const auto line = s.sizing.follow_shares(s.step)) s.reporter.say(*line);
    if (o.dry_run) return s.end_dry_run();

    // Attempt, reduce, agree; retry smaller after an agreed out-of-memory.
    const StepOutcome outcome = s.attempt_until_it_fits(slab, times);
    if (outcome.abandoned) {
      // A stop signal came between micro-batches: this step is not taken (its partial gradient
      // is dropped; buffers and random state were restored), the checkpoint holds the state
      // before it, and a resumed run computes it whole.
      s.stop_for_signal(" (in step " + std::to_string(s.step + 1) +
                        ", between micro-batches: that step is dropped and computed again on "
                        "resume)");
      break;
    }

    // Step, then tell the observers.
    const OptimizerUpdate update = s.update_parameters(outcome);
    const StepSplit split = s.feed.split_of(s.step);
    ++s.step;
    last_loss = outcome.loss;
    times.data_cpu = prefetcher.last_cpu_seconds();
    s.report_step(outcome, update, times, split);
    // Speeds in what the split divides: rows, or the step's tokens for documents.
    if (o.balance) {
      const auto line = s.sizing.rebalance(s.step, s.documents() ? split.tokens : split.rows,
                                           outcome.compute_seconds);
      if (line) s.reporter.say(*line);
    }

    // Evaluation, checkpoints, signals, and the next size to probe.
    if (o.eval_every > 0 && s.step % o.eval_every == 0 && s.step < s.feed.total_steps())
      s.evaluate();
    if (o.checkpoint_every > 0 && s.step % o.checkpoint_every == 0 && s.step < s.feed.total_steps())
      s.save_checkpoint();
    if (outcome.stop && s.step < s.feed.total_steps()) {
      s.stop_for_signal("");
      break;
    }
    if (s.step < s.feed.total_steps()) {
      for (const std::string& line : s.sizing.after_success(s.step))
        s.reporter.say(line);
    }
  }

  return s.end_run(last_loss);
}

// --dry-run: what fits is all it reports; nothing trains, nothing is written.
TrainResult Trainer::State::end_dry_run() {
  for (const std::string& line : sizing.dry_run_lines())
    reporter.say(line);
  result.steps_done = 0;
  reporter.close();
  return result;
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
  result.final_micro_batch = sizing.micro_batches().current(rank);
  result.final_micro_batches = sizing.micro_batches().sizes();
  result.final_loss = last_loss;
  return result;
}

// Attempts at the batch until one succeeds (or a stop signal abandons it), each agreed
// out-of-memory lowering the micro-batch first; `times` counts the retries and their time.
StepOutcome Trainer::State::attempt_until_it_fits(const data::Batch& slab, StepTimes& times) {
  exchange->reset_seconds();
  for (;;) {
    const auto attempt_start = Clock::now();
    StepOutcome outcome = attempt(slab, sizing.micro_batches().current(rank));
    if (outcome.succeeded() || outcome.abandoned) return outcome;
    times.retry_seconds += seconds_since(attempt_start);
    ++times.retries;
    after_out_of_memory(outcome);
  }
}

void Trainer::State::after_out_of_memory(const StepOutcome& outcome) {
  const Sizing::OutOfMemory lowered = sizing.after_out_of_memory(outcome, step);
  result.oom_events += static_cast<std::int64_t>(lowered.event.ranks.size());
  reporter.notify([&](StepObserver& o) { o.on_oom(lowered.event); });
  if (lowered.failure) fail_run(*lowered.failure, ExitCode::kOutOfMemory);
}

// The optimizer's update from the agreed gradients: stepped, skipped (non-finite values, or an
// fp16 overflow, which halves the loss scale), or the run stops (--on-nonfinite stop).
OptimizerUpdate Trainer::State::update_parameters(const StepOutcome& outcome) {
  OptimizerUpdate update;
  update.lr = schedule.lr(step);
  update.loss_scale = loss_scale.value();
  auto stepped = optimizer->apply(exchange->reducer().gradients(), outcome.loss, update.lr);
  // --shard optimizer: each rank updated its slice; every rank gets every slice.
  if (stepped == OptimizerStep::Result::kStepped) exchange->reducer().after_step();
  // fp16: gradients that overflowed at this scale (the loss itself finite) are the scale's
  // doing. Every rank saw the same reduced gradients: all skip and halve together.
  const bool overflow = stepped != OptimizerStep::Result::kStepped && std::isfinite(outcome.loss) &&
                        loss_scale.explains_overflow();
  if (overflow) {
    stepped = OptimizerStep::Result::kSkipped;
    loss_scale.after_overflow();
    ++result.overflow_steps;
    std::ostringstream line;
    line << "step " << step << ": fp16 gradients overflowed at loss scale " << update.loss_scale
         << "; every rank skips the step and continues at " << loss_scale.value();
    reporter.say(line.str());
  } else if (stepped == OptimizerStep::Result::kStepped) {
    loss_scale.after_clean_step();
  }
  if (stepped == OptimizerStep::Result::kStop) {
    fail_run("non-finite loss or gradient at step " + std::to_string(step) + " (loss " +
                 std::to_string(outcome.loss) +
                 "); lower --lr, set --clip-grad-norm, or --on-nonfinite skip",
             ExitCode::kInternal);
  }
  update.skipped = stepped == OptimizerStep::Result::kSkipped;
  if (update.skipped && !overflow) {
    ++result.skipped_steps;
    reporter.say("step " + std::to_string(step) +
                 ": non-finite loss or gradient on some rank; step skipped (" +
                 std::to_string(result.skipped_steps) + " so far)");
  }
  return update;
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
  figures.peak_bytes = peak_bytes;
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
  row.predicted_compute_seconds = predicted_compute;  // rank 0's, which writes the log
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
  row.peak_bytes = *std::max_element(peak_bytes.begin(), peak_bytes.end());
  row.live_bytes = memory::live_bytes();
  row.allreduce_seconds = exchange->seconds();
  row.retry_seconds = times.retry_seconds;
  return row;
}

}  // namespace autoaccum::train
