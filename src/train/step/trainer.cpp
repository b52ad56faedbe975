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
#include "autoaccum/train/run/observers.hpp"
#include "autoaccum/train/sizing/balance.hpp"
#include "autoaccum/train/sizing/micro_batch.hpp"
#include "autoaccum/train/step/optimizer_step.hpp"
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
void request_stop() noexcept {
  g_stop.store(true);
}

// One attempt at the current batch with micro-batch m. Every rank returns the same outcome: it
// comes from the reduced buffer. A failed attempt leaves buffers and random state as they were.
//
// A probe (probe_memory, probe_time) runs only one micro-batch of size m (none when m is 0) and
// always rolls back: it measures memory or time and changes nothing.
StepOutcome Trainer::State::attempt(const data::Batch& slab, std::int64_t m, ProbePiece probe) {
  reducer->begin();
  const std::int64_t tried_before = largest_tried;
  largest_tried = std::max(largest_tried, m);
  const std::int64_t previous = last_tried;
  last_tried = m;
  std::fill(control_values.begin(), control_values.end(), 0.0f);
  // The summed loss stays a tensor until after the all-reduce: no host synchronisation per
  // micro-batch (it matters on a GPU).
  at::Tensor local_loss, local_weight;
  memory::reset_peak();
  const std::int64_t base_bytes = memory::live_bytes();
  const auto compute_start = Clock::now();
  memory::OomWatch watch;
  std::optional<AttemptGuard> guard;
  bool out_of_memory = false;
  bool abandoned = false;
  AttemptPhase phase = AttemptPhase::kBuffers;
  // The memory model's measurement: the micro-batch with the highest peak (each micro-batch's
  // peak measured alone), or the one that ran out.
  std::int64_t attempt_peak = 0;
  MicroBatchShape peak_shape, shape;
  RankReport report;  // its plan's figures now; the outcome's after the micro-batches
  try {
    guard.emplace(*model_state);
    // Lower precision: each weight cast once for all the attempt's micro-batches.
    const CastCacheScope casts(options.precision);
    // Which rows go together: slices of m rows, or documents under a budget of m tokens.
    data::MicroBatchPlan cut;
    if (m > 0) cut = data::plan_micro_batches(slab, m, width_cost(rank), piece_cost(rank));
    report.pieces = static_cast<std::int64_t>(cut.pieces.size());
    report.tokens = cut.tokens;
    report.padded_tokens = cut.padded_tokens;
    predicted_compute = 0;
    if (const auto fit = time_fit(rank); fit && probe == ProbePiece::kNone) {
      for (const data::MicroBatchPiece& piece : cut.pieces)
        predicted_compute += fit->predict(piece_shape(piece));
    }
    if (probe == ProbePiece::kShortPiece && !cut.pieces.empty()) {
      cut.pieces.assign(1, data::short_piece(slab, std::max<std::int64_t>(1, size_floor / 8)));
    } else if (probe != ProbePiece::kNone && !cut.pieces.empty()) {
      std::optional<std::size_t> keep = std::size_t{0};
      if (probe == ProbePiece::kNarrowPiece) keep = data::narrow_piece(cut, m);
      if (keep && *keep > 0) cut.pieces.front() = std::move(cut.pieces[*keep]);
      cut.pieces.resize(keep ? 1 : 0);
      // Documents: the first piece measured at the data's longest width (the budget's floor).
      if (probe == ProbePiece::kFirstPiece && !cut.pieces.empty())
        data::widen_piece(slab, cut.pieces.front(), size_floor, m);
    }
    for (const data::MicroBatchPiece& piece : cut.pieces) {
      // A stop signal ends the attempt between micro-batches, so a long step cannot outlast a
      // scheduler's grace time; the ranks agree at the collective below to drop the step.
      if (stop_requested()) {
        abandoned = true;
        break;
      }
      const auto micro_start = Clock::now();
      shape = piece_shape(piece);
      attempt_peak = std::max(attempt_peak, memory::peak_bytes());
      memory::reset_peak();
      const data::Batch micro = data::micro_batch(slab, piece);
      std::vector<at::Tensor> inputs;
      const std::size_t input_count = micro.size() - 1;  // the fields: inputs, then the target
      for (std::size_t i = 0; i < input_count; ++i)
        inputs.push_back(context.on_device(micro[i]));
      phase = AttemptPhase::kForward;
      const at::Tensor target = context.on_device(micro[input_count]);
      // The gradient of the summed loss accumulates; it is divided once, after the all-reduce,
      // by what the whole global batch counted.
      Objective::Terms terms;
      {
        // --precision: forward and loss under autocast; backward outside it, as in PyTorch.
        const AutocastScope autocast(options.precision, context.device.type());
        at::Tensor output;
        if (objective->from_model())
          std::tie(terms.sum, terms.weight) = model->forward_loss(inputs, target);
        else
          output = model->forward(inputs);
        // Injected after the forward pass, so the activations exist when it throws, as in a
        // real OOM late in forward; they must be released like a real one's.
        if (std::any_of(options.inject_oom.begin(), options.inject_oom.end(), [&](const auto& i) {
              return !i.backward && i.fires(rank, piece.size(), step);
            })) {
          memory::throw_out_of_memory("injected out-of-memory (--inject-oom) at micro-batch " +
                                      std::to_string(piece.size()));
        }
        if (!objective->from_model()) {
          phase = AttemptPhase::kLoss;
          terms = objective->terms(output, target);
        }
      }
      phase = AttemptPhase::kBackward;
      at::Tensor scaled = terms.sum;
      if (loss_scale.enabled()) scaled = scaled * loss_scale.value();
      if (&piece == &cut.pieces.front() &&
          std::any_of(options.inject_overflow.begin(), options.inject_overflow.end(),
                      [&](const auto& i) { return i.rank == rank && i.step == step; }))
        scaled = scaled * std::numeric_limits<double>::infinity();  // --inject-overflow
      // --overlap: the last micro-batch's gradients go in buckets as backward completes them.
      if (&piece == &cut.pieces.back()) reducer->arm(scaled);
      // --inject-oom ...,backward=1: thrown from the first parameter's gradient hook.
      inject_in_backward.store(std::any_of(
          options.inject_oom.begin(), options.inject_oom.end(),
          [&](const auto& i) { return i.backward && i.fires(rank, piece.size(), step); }));
      scaled.backward();
      // Summed in double: a rank's count of tokens may pass 2^24.
      const at::Tensor loss_term = terms.sum.detach().to(at::kDouble);
      const at::Tensor weight_term = terms.weight.to(at::kDouble);
      local_loss = local_loss.defined() ? local_loss + loss_term : loss_term;
      local_weight = local_weight.defined() ? local_weight + weight_term : weight_term;
      if (slow_factor != 1.0) {
        // --inject-slow: as if this rank's hardware were `slow_factor` times slower per row.
        // On a GPU the time is the device's work, not its launches.
        if (context.use_cuda) memory::synchronize_device();
        std::this_thread::sleep_for(
            std::chrono::duration<double>((slow_factor - 1.0) * seconds_since(micro_start)));
      }
      if (!checked_views) {
        if (!reducer->gradients_intact())
          throw Error("internal: autograd replaced a gradient view");
        checked_views = true;
      }
      // A probe's one piece is its shape whatever the peak (a short piece may peak below what
      // the attempt held before it): the time probe fits to it.
      if (memory::peak_bytes() >= attempt_peak || probe != ProbePiece::kNone) {
        attempt_peak = std::max(attempt_peak, memory::peak_bytes());
        peak_shape = shape;
      }
    }
    if (!abandoned) {
      phase = AttemptPhase::kBuffers;
      model_state->write_changes(reducer->part(Reducer::Part::kBuffers));
    }
    phase = AttemptPhase::kNone;
  } catch (const std::exception& e) {
    // Only an OOM is agreed on here, and the model's own error (LibTorch's or the TorchScript
    // code's, in forward, loss or backward) on a micro-batch smaller than one this rank tried
    // before an out-of-memory lowered it: a size the model does not accept, such as BatchNorm's
    // one row. Anything else, autoaccum's own errors above all (internal ones, a model that
    // returns the wrong kind of output), is this rank's own failure (spmd_main aborts).
    if (!watch.explains(e)) {
      const bool from_the_model =
          dynamic_cast<const Error*>(&e) == nullptr &&
          (phase == AttemptPhase::kForward || phase == AttemptPhase::kLoss ||
           phase == AttemptPhase::kBackward);
      if (!(from_the_model && m > 0 && m < tried_before && ran_out_before)) throw;
      refusal = e.what();
      refused_after = previous;
      phase = AttemptPhase::kRefused;
    }
    out_of_memory = true;
    local_loss = at::Tensor();
    local_weight = at::Tensor();
    peak_shape = shape;
  }
  // --balance splits by the time each rank computed: on a GPU, the kernels' time, not their
  // launches' (one wait per step, only when balancing).
  // The compute time is what --balance weighs and what the time model fits and is checked by.
  if (context.use_cuda && !out_of_memory &&
      (options.balance || options.micro_batch_cost == TrainOptions::MicroBatchCost::kAuto))
    memory::synchronize_device();
  report.out_of_memory = out_of_memory;
  report.phase = out_of_memory ? phase : AttemptPhase::kNone;
  report.peak_bytes = std::max(attempt_peak, memory::peak_bytes());
  report.stop_requested = stop_requested();
  report.abandoned = abandoned;
  report.compute_seconds = seconds_since(compute_start);
  report.peak_shape = peak_shape;
  report.base_bytes = base_bytes;
  write_report(control, rank, report, control_values.data());
  at::Tensor slots = reducer->part(Reducer::Part::kControl);
  const auto control_count = static_cast<std::int64_t>(control_values.size());
  slots.copy_(at::from_blob(control_values.data(), {control_count}, at::kFloat));
  if (local_loss.defined()) {
    // On the device, without a host synchronisation: the values' exact float pieces.
    const auto pieces = static_cast<std::int64_t>(kExactSlots);
    slots.narrow(0, static_cast<std::int64_t>(control.loss(rank)), pieces)
        .copy_(exact_pieces(local_loss));
    slots.narrow(0, static_cast<std::int64_t>(control.weight(rank)), pieces)
        .copy_(exact_pieces(local_weight));
  }

  // On a GPU, NCCL's stream waits for the backward pass through an event: the time below
  // includes backward kernels still queued.
  const auto reduce_start = Clock::now();
  reducer->reduce();
  allreduce_seconds += seconds_since(reduce_start);
  at::from_blob(control_values.data(), {control_count}, at::kFloat)
      .copy_(reducer->part(Reducer::Part::kControl));

  StepOutcome outcome = agree_on_step(control, control_values.data());
  if (!outcome.out_of_memory.empty()) ran_out_before = true;
  for (int r = 0; r < world; ++r) {
    auto& peak = peak_bytes[static_cast<std::size_t>(r)];
    peak = std::max(peak, outcome.peak_bytes[static_cast<std::size_t>(r)]);
  }
  if (probe != ProbePiece::kShortPiece) learn_memory(outcome);
  if (outcome.succeeded() && probe == ProbePiece::kNone) {
    // The mean over what the global batch counted, and the loss scale undone, in one pass.
    const double divisor = (outcome.weight > 0 ? outcome.weight : 1.0) * loss_scale.value();
    if (divisor != 1.0) reducer->gradients().mul_(1.0 / divisor);
    model_state->apply_mean_change(reducer->part(Reducer::Part::kBuffers));
    guard->commit();
  }
  return outcome;  // otherwise the guard restores buffers and random state
}

// --balance throughput: every --balance-every steps, new shares in proportion to each rank's
// measured rows per second since the last change, computed by every rank from the same reduced
// numbers. They apply from the step after next: the prefetcher is already reading the next one.
void Trainer::State::rebalance(const std::vector<std::int64_t>& step_shares,
                               const std::vector<double>& compute_seconds) {
  speed_window.add(step_shares, compute_seconds);
  if (step % options.balance_every != 0 || step + 1 >= total_steps) return;
  const std::vector<double> speeds = speed_window.speeds();
  speed_window.clear();
  if (std::any_of(speeds.begin(), speeds.end(), [](double v) { return !(v > 0); })) return;
  // Rows: whole rows, each rank at least its micro-batch when that is fixed, at least one row
  // when it is automatic (the micro-batch then follows the share: follow_shares). Documents:
  // weights of the batch's tokens (parts of kTokenShares), each rank at least one part; the
  // split keeps a document per rank.
  const std::int64_t total = share_total();
  std::vector<std::int64_t> floors;
  for (int r = 0; r < world; ++r)
    floors.push_back(documents() || micro_batches->automatic()
                         ? 1
                         : std::min(micro_batches->current(r), total / world));
  const auto next = balanced_shares(total, speeds, floors);
  if (next == shares->shares(step + 1)) return;
  shares->change(step + 1, next);
  std::vector<std::int64_t> rates;
  for (double v : speeds)
    rates.push_back(static_cast<std::int64_t>(std::lround(v)));
  if (documents()) {
    std::string percents;
    for (std::size_t r = 0; r < next.size(); ++r)
      percents += (r ? ", " : "") +
                  std::to_string(std::lround(100.0 * static_cast<double>(next[r]) /
                                             static_cast<double>(total))) +
                  "%";
    say("step " + std::to_string(step) + ": tokens per rank " + percents +
        " of each batch from step " + std::to_string(step + 1) + " (measured tokens/s " +
        sizes_text(rates) + ")");
    return;
  }
  say("step " + std::to_string(step) + ": rows per rank " + sizes_text(next) + " from step " +
      std::to_string(step + 1) + " (measured rows/s " + sizes_text(rates) + ")");
}

void Trainer::State::stop_for_signal(const std::string& where) {
  save_checkpoint();
  finish("preempted");
  say("autoaccum: stopped by a signal at step " + std::to_string(step) + where +
      (options.checkpoint.empty() ? std::string(" (no --checkpoint given: progress is lost)")
                                  : "; checkpoint written to " + options.checkpoint));
  result.preempted = true;
}

void Trainer::State::evaluate() {
  if (!val_reader) return;
  const std::int64_t m = options.eval_micro_batch > 0
                             ? options.eval_micro_batch
                             : std::max<std::int64_t>(micro_batches->current(rank) * 4, 256);
  const EvalEvent event =
      train::evaluate(*model, *objective, *val_reader, comm, m, step, options.precision,
                      [this](const at::Tensor& t) { return context.on_device(t); });
  result.eval_loss = event.loss;
  result.eval_accuracy =
      event.classification ? std::optional<double>(event.accuracy) : std::nullopt;
  notify([&](StepObserver& o) { o.on_eval(event); });
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
      [&s](std::int64_t global_step) { return s.read_rank_rows(global_step); }, s.step,
      s.total_steps);
  double last_loss = 0;

  comm::Watchdog& dog = comm::watchdog();
  while (s.step < s.total_steps) {
    dog.set_context(s.watchdog_context());
    for (const auto& stall : o.inject_stall) {
      if (stall.rank == s.rank && stall.step == s.step)  // --inject-stall
        std::this_thread::sleep_for(std::chrono::duration<double>(stall.seconds));
    }
    // Read the slab.
    const auto step_start = Clock::now();
    const double waited_before = prefetcher.waited_seconds();
    const data::Batch slab = prefetcher.next();
    const double data_wait = prefetcher.waited_seconds() - waited_before;
    s.probe_memory(slab);  // before the first step only (--micro-batch-search predict)
    s.probe_time(slab);    // then, documents with --micro-batch-cost auto
    s.follow_shares();     // --balance throughput: automatic sizes follow changed shares
    if (o.dry_run) {
      s.report_dry_run();
      s.result.steps_done = 0;
      s.finished.store(true);
      return s.result;
    }

    // Attempt, reduce, agree; retry smaller after an agreed out-of-memory.
    std::int64_t retries = 0;
    double retry_seconds = 0;
    s.allreduce_seconds = 0;
    StepOutcome outcome;
    for (;;) {
      const auto attempt_start = Clock::now();
      outcome = s.attempt(slab, s.micro_batches->current(s.rank));
      if (outcome.succeeded() || outcome.abandoned) break;
      retry_seconds += seconds_since(attempt_start);
      ++retries;
      s.after_out_of_memory(outcome);
    }

    if (outcome.abandoned) {
      // A stop signal came between micro-batches: this step is not taken (its partial gradient
      // is dropped; buffers and random state were restored), the checkpoint holds the state
      // before it, and a resumed run computes it whole.
      s.stop_for_signal(" (in step " + std::to_string(s.step + 1) +
                        ", between micro-batches: that step is dropped and computed again on "
                        "resume)");
      break;
    }

    // Step.
    const double lr = s.schedule.lr(s.step);
    const double loss_scale = s.loss_scale.value();
    auto stepped = s.optimizer->apply(s.reducer->gradients(), outcome.loss, lr);
    // --shard optimizer: each rank updated its slice; every rank gets every slice.
    if (stepped == OptimizerStep::Result::kStepped) s.reducer->after_step();
    // fp16: gradients that overflowed at this scale (the loss itself finite) are the scale's
    // doing. Every rank saw the same reduced gradients: all skip and halve together.
    const bool overflow = stepped != OptimizerStep::Result::kStepped &&
                          std::isfinite(outcome.loss) && s.loss_scale.explains_overflow();
    if (overflow) {
      stepped = OptimizerStep::Result::kSkipped;
      s.loss_scale.after_overflow();
      ++s.result.overflow_steps;
      std::ostringstream line;
      line << "step " << s.step << ": fp16 gradients overflowed at loss scale " << loss_scale
           << "; every rank skips the step and continues at " << s.loss_scale.value();
      s.say(line.str());
    } else if (stepped == OptimizerStep::Result::kStepped) {
      s.loss_scale.after_clean_step();
    }
    if (stepped == OptimizerStep::Result::kStop) {
      s.fail_run("non-finite loss or gradient at step " + std::to_string(s.step) + " (loss " +
                     std::to_string(outcome.loss) +
                     "); lower --lr, set --clip-grad-norm, or --on-nonfinite skip",
                 ExitCode::kInternal);
    }
    const bool skipped = stepped == OptimizerStep::Result::kSkipped;
    if (skipped && !overflow) {
      ++s.result.skipped_steps;
      s.say("step " + std::to_string(s.step) +
            ": non-finite loss or gradient on some rank; step skipped (" +
            std::to_string(s.result.skipped_steps) + " so far)");
    }
    const Trainer::State::StepSplit split = s.split_of(s.step);
    const std::vector<std::int64_t>& step_shares = split.rows;
    // Document data: every rank's plan as it reported it in the attempt that succeeded.
    std::int64_t step_tokens = 0, step_padded = 0;
    std::vector<std::int64_t> rank_pieces;
    if (s.documents()) {
      for (int r = 0; r < s.world; ++r) {
        const auto i = static_cast<std::size_t>(r);
        step_tokens += outcome.tokens[i];
        step_padded += outcome.padded_tokens[i];
      }
      rank_pieces = outcome.pieces;
    }
    ++s.step;
    last_loss = outcome.loss;

    // Notify observers.
    const double step_seconds = seconds_since(step_start);
    io::StepRow row;
    row.step = s.step - 1;
    row.epoch = s.position(s.step - 1).epoch;
    row.micro_batch = s.micro_batches->current(0);
    // Every rank's micro-batches: the pieces each reported for documents, ceil(rows / size)
    // for rows. Rank 0's is `accumulation`; the most, and who ran it, is what the step waited on.
    RankFigures figures;
    for (int r = 0; r < s.world; ++r) {
      const auto i = static_cast<std::size_t>(r);
      figures.accumulation.push_back(
          s.documents() ? rank_pieces[i] : s.micro_batches->accumulation(r, step_shares[i]));
    }
    const auto most = std::max_element(figures.accumulation.begin(), figures.accumulation.end());
    row.accumulation = figures.accumulation.front();
    row.accumulation_max = *most;  // max_element: the first, so the lowest such rank
    row.accumulation_max_rank = static_cast<std::int64_t>(most - figures.accumulation.begin());
    row.tokens = step_tokens;
    row.padded_tokens = step_padded;
    row.compute_seconds = outcome.compute_seconds.empty() ? 0.0 : outcome.compute_seconds.front();
    row.predicted_compute_seconds = s.predicted_compute;  // rank 0's, which writes the log
    row.loss = outcome.loss;
    row.lr = lr;
    row.loss_scale = loss_scale;
    row.step_seconds = step_seconds;
    row.samples_per_second = static_cast<double>(std::accumulate(
                                 step_shares.begin(), step_shares.end(), std::int64_t{0})) /
                             step_seconds;
    row.oom_retries = retries;
    row.skipped = skipped ? 1 : 0;
    row.data_wait_seconds = data_wait;
    row.data_cpu_seconds = prefetcher.last_cpu_seconds();
    row.peak_bytes = *std::max_element(s.peak_bytes.begin(), s.peak_bytes.end());
    row.live_bytes = memory::live_bytes();
    row.allreduce_seconds = s.allreduce_seconds;
    row.retry_seconds = retry_seconds;
    figures.peak_bytes = s.peak_bytes;
    figures.micro_batches = s.micro_batches->sizes();
    figures.rows = step_shares;
    figures.documents = s.documents();
    s.notify([&](StepObserver& observer) { observer.on_step(row, figures); });
    // Speeds in what the split divides: rows, or the step's tokens for documents.
    if (o.balance) s.rebalance(s.documents() ? split.tokens : split.rows, outcome.compute_seconds);

    // Evaluation, checkpoints, signals, and the next size to probe.
    if (o.eval_every > 0 && s.step % o.eval_every == 0 && s.step < s.total_steps) s.evaluate();
    if (o.checkpoint_every > 0 && s.step % o.checkpoint_every == 0 && s.step < s.total_steps)
      s.save_checkpoint();
    if (outcome.stop && s.step < s.total_steps) {
      s.stop_for_signal("");
      break;
    }
    const std::vector<int> probing =
        s.step < s.total_steps ? s.micro_batches->after_success() : std::vector<int>{};
    const auto what = [&](int r) {
      return s.micro_batches->regrowing(r)
                 ? "tries micro-batch " + std::to_string(s.micro_batches->current(r)) +
                       " again after " + std::to_string(s.regrow_steps()) +
                       " clean steps (--micro-batch-regrow)"
                 : "probes micro-batch " + std::to_string(s.micro_batches->current(r));
    };
    if (!probing.empty() && !s.micro_batches->per_rank())
      s.say("every rank " + what(probing.front()) + " at step " + std::to_string(s.step));
    for (int r : s.micro_batches->per_rank() ? probing : std::vector<int>{})
      s.say("rank " + std::to_string(r) + " " + what(r) + " at step " + std::to_string(s.step));
  }

  if (!s.result.preempted) {
    dog.set_context(s.watchdog_context());
    s.save_checkpoint();  // first: an evaluation that fails must not cost the trained model
    s.evaluate();
    s.finish("completed");
  }
  s.result.steps_done = s.step;
  s.result.final_micro_batch = s.micro_batches->current(s.rank);
  s.result.final_micro_batches = s.micro_batches->sizes();
  s.result.final_loss = last_loss;
  return s.result;
}

}  // namespace autoaccum::train
