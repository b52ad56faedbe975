// StepRunner: the attempts at a batch, their reduction and agreement, the update, and the probes
// the step drives before the first step (step/step_runner.hpp; docs/design.md).
#include "autoaccum/train/step/step_runner.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <limits>
#include <optional>
#include <sstream>
#include <tuple>

#include "autoaccum/core/error.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/model/precision.hpp"
#include "autoaccum/train/sizing/time_model.hpp"
#include "autoaccum/train/sizing/time_probe.hpp"
#include "autoaccum/train/trainer.hpp"

namespace autoaccum::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

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

StepRunner::StepRunner(Rooms rooms)
    : options_(rooms.options),
      comm_(rooms.comm),
      rank_(rooms.comm.rank()),
      world_(rooms.comm.size()),
      context_(rooms.context),
      model_(rooms.model.model()),
      model_state_(rooms.model.state()),
      objective_(rooms.model.objective()),
      optimizer_(rooms.optimizer),
      schedule_(rooms.schedule),
      loss_scale_(rooms.loss_scale),
      exchange_(rooms.exchange),
      sizing_(rooms.sizing),
      feed_(rooms.feed),
      reporter_(rooms.reporter),
      drills_(rooms.options, rooms.comm.rank()),
      control_{rooms.comm.size()},
      control_values_(static_cast<std::size_t>(control_.count()), 0.0f),
      peak_bytes_(static_cast<std::size_t>(rooms.comm.size()), 0) {
  drills_.install_backward(rooms.model.parameters().trainable);  // --inject-oom ...,backward=1
}

std::int64_t StepRunner::control_floats(int world) {
  return ControlLayout{world}.count();
}

void StepRunner::probe(const data::Batch& slab, std::int64_t step) {
  step_ = step;
  run_memory_probe(slab);  // --micro-batch-search predict, --dry-run
  run_time_probe(slab);    // then documents with --micro-batch-cost auto
}

StepRunner::Taken StepRunner::take(const data::Batch& slab, std::int64_t step) {
  step_ = step;
  Taken taken;
  taken.outcome = attempt_until_it_fits(slab, taken);
  if (!taken.outcome.abandoned) taken.update = update_parameters(taken.outcome);
  return taken;
}

// --micro-batch-search predict (and --dry-run): before the first step only; every rank then
// starts at the size its memory model predicts (Sizing::start_from_probe).
void StepRunner::run_memory_probe(const data::Batch& slab) {
  const std::optional<MemoryProbe::Setup> setup = sizing_.take_memory_probe();
  if (!setup) return;
  const auto start = Clock::now();
  MemoryProbe probe(*setup);
  while (!probe.done()) {
    const MemoryProbe::Attempt next = probe.next(rank_);
    const StepOutcome outcome = attempt(slab, next.size, next.piece);
    sizing_.fail_if_refused(outcome);
    if (outcome.abandoned || outcome.stop) break;  // start without a prediction
    probe.take(outcome);
    if (!probe.nothing_fits().empty()) sizing_.fail_nothing_fits(probe, outcome);
  }
  const MemoryPrediction event = sizing_.start_from_probe(probe, seconds_since(start), step_);
  reporter_.notify([&](StepObserver& o) { o.on_prediction(event); });
}

// Documents with --micro-batch-cost auto: after the memory probe (or at a fixed budget), before
// the first step. A piece that runs out of memory lowers the budget as a step's would.
void StepRunner::run_time_probe(const data::Batch& slab) {
  if (!sizing_.take_time_probe()) return;
  const auto start = Clock::now();
  TimeProbeSchedule probe(world_);
  while (!probe.done()) {
    const std::int64_t m =
        probe.next_size(sizing_.micro_batches().current(rank_), feed_.sizes().floor);
    const StepOutcome outcome = attempt(slab, m, probe.next_piece());
    sizing_.fail_if_refused(outcome);
    if (outcome.abandoned || outcome.stop) {  // no fits: the step loop stops
      sizing_.drop_time_fits();
      memory::release_cached_memory();
      return;
    }
    if (!outcome.out_of_memory.empty()) after_out_of_memory(outcome);
    probe.take(outcome);
  }
  const TimeProbe event = sizing_.fit_times(probe, seconds_since(start), step_);
  reporter_.notify([&](StepObserver& o) { o.on_time_probe(event); });
}

// One attempt at the current batch with micro-batch m. Every rank returns the same outcome: it
// comes from the reduced buffer. A failed attempt leaves buffers and random state as they were.
//
// A probe (run_memory_probe, run_time_probe) runs only one micro-batch of size m (none when m is
// 0) and always rolls back: it measures memory or time and changes nothing.
StepOutcome StepRunner::attempt(const data::Batch& slab, std::int64_t m, ProbePiece probe) {
  exchange_.reducer().begin();
  sizing_.refusals().start(m);
  memory::reset_peak();
  const std::int64_t base_bytes = memory::live_bytes();
  const auto compute_start = Clock::now();
  memory::OomWatch watch;
  std::optional<AttemptGuard> guard;
  AttemptProgress progress;
  RankReport report;  // its plan's figures now; the outcome's after the micro-batches
  try {
    guard.emplace(model_state_);
    // Lower precision: each weight cast once for all the attempt's micro-batches.
    const CastCacheScope casts(options_.precision);
    const data::MicroBatchPlan cut = plan_attempt(slab, m, probe, report);
    exchange_.reducer().expect_micro_batches(static_cast<std::int64_t>(cut.pieces.size()));
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
  if (context_.use_cuda && !progress.out_of_memory && (options_.balance || feed_.cut_by_time()))
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
  if (probe != ProbePiece::kShortPiece) sizing_.learn(outcome);
  if (outcome.succeeded() && probe == ProbePiece::kNone) {
    take_mean(outcome);
    guard->commit();
  }
  return outcome;  // otherwise the guard restores buffers and random state
}

// The mean over what the global batch counted, and the loss scale undone, in one pass; the
// buffers' mean change (BatchNorm statistics) applied.
void StepRunner::take_mean(const StepOutcome& outcome) {
  const double divisor = (outcome.weight > 0 ? outcome.weight : 1.0) * loss_scale_.value();
  if (divisor != 1.0) exchange_.reducer().gradients().mul_(1.0 / divisor);
  model_state_.apply_mean_change(exchange_.reducer().part(Reducer::Part::kBuffers));
}

// The attempt's micro-batches in order, then the buffers' changes for the reduction.
void StepRunner::run_pieces(const data::Batch& slab, const data::MicroBatchPlan& cut, bool probing,
                            AttemptProgress& progress) {
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
    model_state_.write_changes(exchange_.reducer().part(Reducer::Part::kBuffers));
  }
  progress.phase = AttemptPhase::kNone;
}

// Which rows go together: slices of m rows, or documents under a budget of m tokens; a probe keeps
// one piece of that plan (ProbePiece). `report` takes the plan's figures, `predicted_compute` its
// predicted time.
data::MicroBatchPlan StepRunner::plan_attempt(const data::Batch& slab, std::int64_t m,
                                              ProbePiece probe, RankReport& report) {
  data::MicroBatchPlan cut;
  if (m > 0)
    cut = data::plan_micro_batches(slab, m, sizing_.costs().width_cost(rank_),
                                   sizing_.costs().piece_cost(options_, rank_));
  report.pieces = static_cast<std::int64_t>(cut.pieces.size());
  report.tokens = cut.tokens;
  report.padded_tokens = cut.padded_tokens;
  predicted_compute_ = 0;
  if (const auto fit = sizing_.costs().time_fit(rank_); fit && probe == ProbePiece::kNone) {
    for (const data::MicroBatchPiece& piece : cut.pieces)
      predicted_compute_ += fit->predict(piece_shape(piece));
  }
  if (probe == ProbePiece::kNone || cut.pieces.empty()) return cut;
  if (probe == ProbePiece::kShortPiece) {
    cut.pieces.assign(1,
                      data::short_piece(slab, std::max<std::int64_t>(1, feed_.sizes().floor / 8)));
    return cut;
  }
  std::optional<std::size_t> keep = std::size_t{0};
  if (probe == ProbePiece::kNarrowPiece) keep = data::narrow_piece(cut, m);
  if (keep && *keep > 0) cut.pieces.front() = std::move(cut.pieces[*keep]);
  cut.pieces.resize(keep ? 1 : 0);
  // Documents: the first piece measured at the data's longest width (the budget's floor).
  if (probe == ProbePiece::kFirstPiece && !cut.pieces.empty())
    data::widen_piece(slab, cut.pieces.front(), feed_.sizes().floor, m);
  return cut;
}

// One micro-batch: forward, loss and backward; its gradient accumulates, its loss terms add to
// the attempt's. `first` and `last`: its place in the attempt (the overflow drill takes the first;
// --overlap sends the last one's gradients as backward completes them).
void StepRunner::run_micro_batch(const data::Batch& slab, const data::MicroBatchPiece& piece,
                                 bool first, bool last, bool probing, AttemptProgress& progress) {
  const auto micro_start = Clock::now();
  progress.shape = piece_shape(piece);
  progress.peak = std::max(progress.peak, memory::peak_bytes());
  memory::reset_peak();
  const data::Batch micro = data::micro_batch(slab, piece);
  std::vector<at::Tensor> inputs;
  const std::size_t input_count = micro.size() - 1;  // the fields: inputs, then the target
  for (std::size_t i = 0; i < input_count; ++i)
    inputs.push_back(context_.on_device(micro[i]));
  progress.phase = AttemptPhase::kForward;
  const at::Tensor target = context_.on_device(micro[input_count]);
  // The gradient of the summed loss accumulates; it is divided once, after the all-reduce, by
  // what the whole global batch counted.
  const Objective::Terms terms = forward_terms(inputs, target, piece.size(), progress.phase);
  progress.phase = AttemptPhase::kBackward;
  at::Tensor scaled = terms.sum;
  if (loss_scale_.enabled()) scaled = scaled * loss_scale_.value();
  if (first && drills_.overflow(step_))
    scaled = scaled * std::numeric_limits<double>::infinity();  // --inject-overflow
  // --overlap (the last micro-batch) and --shard gradients (every one): gradients go in buckets
  // as backward makes them.
  exchange_.reducer().before_backward(scaled, last);
  drills_.arm_backward(piece.size(), step_);  // --inject-oom ...,backward=1
  scaled.backward();
  exchange_.reducer().after_backward();
  // Summed in double: a rank's count of tokens may pass 2^24.
  const at::Tensor loss_term = terms.sum.detach().to(at::kDouble);
  const at::Tensor weight_term = terms.weight.to(at::kDouble);
  progress.loss = progress.loss.defined() ? progress.loss + loss_term : loss_term;
  progress.weight = progress.weight.defined() ? progress.weight + weight_term : weight_term;
  if (drills_.slow()) {
    if (context_.use_cuda) memory::synchronize_device();  // the device's work, not its launches
    drills_.slow_down(micro_start);
  }
  exchange_.check_views();
  // A probe's one piece is its shape whatever the peak (a short piece may peak below what the
  // attempt held before it): the time probe fits to it.
  if (memory::peak_bytes() >= progress.peak || probing) {
    progress.peak = std::max(progress.peak, memory::peak_bytes());
    progress.peak_shape = progress.shape;
  }
}

// Forward and loss under autocast (--precision; backward runs outside it, as in PyTorch): the
// objective's terms on the output, or the model's own (--loss model). `phase` moves to the loss.
Objective::Terms StepRunner::forward_terms(const std::vector<at::Tensor>& inputs,
                                           const at::Tensor& target, std::int64_t rows,
                                           AttemptPhase& phase) {
  const AutocastScope autocast(options_.precision, context_.device.type());
  Objective::Terms terms;
  at::Tensor output;
  if (objective_.from_model())
    std::tie(terms.sum, terms.weight) = model_.forward_loss(inputs, target);
  else
    output = model_.forward(inputs);
  // Injected after the forward pass, so the activations exist when it throws, as in a real OOM
  // late in forward; they must be released like a real one's.
  if (drills_.out_of_memory(/*backward=*/false, rows, step_)) {
    memory::throw_out_of_memory("injected out-of-memory (--inject-oom) at micro-batch " +
                                std::to_string(rows));
  }
  if (objective_.from_model()) return terms;
  phase = AttemptPhase::kLoss;
  return objective_.terms(output, target);
}

// Only an out-of-memory is agreed on in an attempt, and the model's own error (LibTorch's or the
// TorchScript code's, in forward, loss or backward) on a micro-batch smaller than one this rank
// tried before an out-of-memory lowered it: a size the model does not accept, such as
// BatchNorm's one row (recorded as the refusal). Anything else, autoaccum's own errors above all
// (internal ones, a model that returns the wrong kind of output), is this rank's own failure:
// rethrown (spmd_main aborts).
void StepRunner::refuse_or_rethrow(const std::exception& e, AttemptPhase phase) {
  const bool from_the_model = dynamic_cast<const Error*>(&e) == nullptr &&
                              (phase == AttemptPhase::kForward || phase == AttemptPhase::kLoss ||
                               phase == AttemptPhase::kBackward);
  if (!sizing_.refusals().take(e.what(), from_the_model)) throw;
}

// This rank's report and loss terms into the control region, the step's one reduction, and the
// outcome every rank agrees on from it.
StepOutcome StepRunner::reduce_and_agree(const RankReport& report,
                                         const AttemptProgress& progress) {
  std::fill(control_values_.begin(), control_values_.end(), 0.0f);
  write_report(control_, rank_, report, control_values_.data());
  at::Tensor slots = exchange_.reducer().part(Reducer::Part::kControl);
  const auto control_count = static_cast<std::int64_t>(control_values_.size());
  slots.copy_(at::from_blob(control_values_.data(), {control_count}, at::kFloat));
  if (progress.loss.defined()) {
    // On the device, without a host synchronisation: the values' exact float pieces.
    const auto pieces = static_cast<std::int64_t>(comm::kExactSlots);
    slots.narrow(0, static_cast<std::int64_t>(control_.loss(rank_)), pieces)
        .copy_(exact_pieces(progress.loss));
    slots.narrow(0, static_cast<std::int64_t>(control_.weight(rank_)), pieces)
        .copy_(exact_pieces(progress.weight));
  }
  exchange_.reduce();
  at::from_blob(control_values_.data(), {control_count}, at::kFloat)
      .copy_(exchange_.reducer().part(Reducer::Part::kControl));
  StepOutcome outcome = agree_on_step(control_, control_values_.data());
  if (!outcome.out_of_memory.empty()) sizing_.refusals().saw_out_of_memory();
  for (int r = 0; r < world_; ++r) {
    auto& peak = peak_bytes_[static_cast<std::size_t>(r)];
    peak = std::max(peak, outcome.peak_bytes[static_cast<std::size_t>(r)]);
  }
  return outcome;
}

// Attempts at the batch until one succeeds (or a stop signal abandons it), each agreed
// out-of-memory lowering the micro-batch first; `taken` counts the retries and their time.
StepOutcome StepRunner::attempt_until_it_fits(const data::Batch& slab, Taken& taken) {
  exchange_.reset_seconds();
  for (;;) {
    const auto attempt_start = Clock::now();
    StepOutcome outcome = attempt(slab, sizing_.micro_batches().current(rank_));
    if (outcome.succeeded() || outcome.abandoned) return outcome;
    taken.retry_seconds += seconds_since(attempt_start);
    ++taken.retries;
    after_out_of_memory(outcome);
  }
}

void StepRunner::after_out_of_memory(const StepOutcome& outcome) {
  const Sizing::OutOfMemory lowered = sizing_.after_out_of_memory(outcome, step_);
  counts_.oom_events += static_cast<std::int64_t>(lowered.event.ranks.size());
  reporter_.notify([&](StepObserver& o) { o.on_oom(lowered.event); });
  if (lowered.failure) throw CollectiveError(*lowered.failure, ExitCode::kOutOfMemory, 0);
}

// The optimizer's update from the agreed gradients: stepped, skipped (non-finite values, or an
// fp16 overflow, which halves the loss scale), or the run stops (--on-nonfinite stop).
OptimizerUpdate StepRunner::update_parameters(const StepOutcome& outcome) {
  OptimizerUpdate update;
  update.lr = schedule_.lr(step_);
  update.loss_scale = loss_scale_.value();
  auto stepped = optimizer_.apply(exchange_.reducer().gradients(), outcome.loss, update.lr);
  // --shard optimizer: each rank updated its slice; every rank gets every slice.
  if (stepped == OptimizerStep::Result::kStepped) exchange_.reducer().after_step();
  // fp16: gradients that overflowed at this scale (the loss itself finite) are the scale's
  // doing. Every rank saw the same reduced gradients: all skip and halve together.
  const bool overflow = stepped != OptimizerStep::Result::kStepped && std::isfinite(outcome.loss) &&
                        loss_scale_.explains_overflow();
  if (overflow) {
    stepped = OptimizerStep::Result::kSkipped;
    loss_scale_.after_overflow();
    ++counts_.overflow_steps;
    std::ostringstream line;
    line << "step " << step_ << ": fp16 gradients overflowed at loss scale " << update.loss_scale
         << "; every rank skips the step and continues at " << loss_scale_.value();
    reporter_.say(line.str());
  } else if (stepped == OptimizerStep::Result::kStepped) {
    loss_scale_.after_clean_step();
  }
  if (stepped == OptimizerStep::Result::kStop) {
    throw CollectiveError("non-finite loss or gradient at step " + std::to_string(step_) +
                              " (loss " + std::to_string(outcome.loss) +
                              "); lower --lr, set --clip-grad-norm, or --on-nonfinite skip",
                          ExitCode::kInternal, 0);
  }
  update.skipped = stepped == OptimizerStep::Result::kSkipped;
  if (update.skipped && !overflow) {
    ++counts_.skipped_steps;
    reporter_.say("step " + std::to_string(step_) +
                  ": non-finite loss or gradient on some rank; step skipped (" +
                  std::to_string(counts_.skipped_steps) + " so far)");
  }
  return update;
}

}  // namespace autoaccum::train
