// Trainer's memory concern: every rank's limit, the memory models fed by every attempt, the
// probe that predicts the first micro-batch (--micro-batch-search predict; docs/design.md), and
// what the ranks do after an agreed out-of-memory (lower the sizes, or end the run in one line).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/sizing/memory_model.hpp"

#include "../trainer_state.hpp"

namespace autoaccum::train {
namespace {

// The last non-empty line of an error: what a TorchScript traceback ends with (the model's own
// words, e.g. "builtins.ValueError: Expected more than 1 value per channel ...").
std::string last_line(const std::string& text) {
  std::size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return text;
  const std::size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end + 1 - (begin == std::string::npos ? 0 : begin + 1));
}

}  // namespace

// Each rank's limit, known on every rank: its --memory-limit item on the CPU; on a GPU the limit
// given, or else the device's memory.
void Trainer::State::gather_limits() {
  std::int64_t mine = options.memory_limit;
  if (context.use_cuda && mine <= 0) mine = memory::cuda_total_bytes(context.device.index());
  limits.gather(comm, mine);
  memory_models.assign(static_cast<std::size_t>(world), MemoryModel{});
}

void Trainer::State::learn_memory(const StepOutcome& outcome) {
  for (int r = 0; r < world; ++r) {
    const auto i = static_cast<std::size_t>(r);
    MemoryModel& memory = memory_models[i];
    memory.set_base(outcome.base_bytes[i]);
    const bool ran_out = std::find(outcome.out_of_memory.begin(), outcome.out_of_memory.end(), r) !=
                         outcome.out_of_memory.end();
    if (ran_out)
      memory.ran_out(outcome.peak_shapes[i]);
    else if (!outcome.abandoned)
      memory.observe(outcome.peak_shapes[i], outcome.peak_bytes[i]);
  }
}

// What the memory probe starts from (sizing/memory_probe.hpp; the step drives it).
MemoryProbe::Setup Trainer::State::memory_probe_setup() const {
  MemoryProbe::Setup setup;
  setup.world = world;
  setup.documents = documents();
  // Rows: at least 2, since BatchNorm cannot train on one row. Documents: the longest document.
  setup.low = documents() ? size_floor : std::min<std::int64_t>(2, size_cap);
  setup.size_cap = size_cap;
  setup.narrow_point = documents() && options.token_cost_by_memory;
  setup.limits = limits.all();
  return setup;
}

// The smallest probe ran out: the state the model keeps whatever the micro-batch leaves no room.
// One line, before halving to sizes that cannot help.
void Trainer::State::fail_nothing_fits(const MemoryProbe& probe, const AttemptOutcome& outcome) {
  const std::vector<int>& nothing_fits = probe.nothing_fits();
  const std::int64_t low = probe.low();
  std::int64_t peak = 0;
  for (int r : nothing_fits)
    peak = std::max(peak, outcome.peak_bytes[static_cast<std::size_t>(r)]);
  std::ostringstream message;
  message << ranks_text(nothing_fits) << " ran out of memory on a micro-batch of "
          << count_text(low) << " while probing memory before the first step ("
          << limits.text(nothing_fits) << ", peak " << memory::format_bytes(peak)
          << "): the model's parameters, gradients and optimizer state leave no room for "
             "its activations; raise --memory-limit, use more memory per rank or a smaller "
             "model"
          << (options.optimizer == "adamw" ? ", or --optimizer sgd (no moment buffers)" : "");
  fail_run(message.str(), ExitCode::kOutOfMemory);
}

// Rank r's starting size from its memory model (and the probe's sizes), with its line of the
// prediction.
std::int64_t Trainer::State::predicted_size(const MemoryProbe& probe, int r,
                                            MemoryPrediction::Rank& line) const {
  const auto i = static_cast<std::size_t>(r);
  const double width = documents() ? static_cast<double>(size_floor) : 0.0;
  const auto predicted =
      memory_models[i].largest(limits.of(r), options.memory_margin, size_cap, width);
  std::int64_t size = predicted ? *predicted : probe.failed(r) > 0 ? probe.fitted(r) : size_cap;
  // A size the probe measured is kept even when the margin says less.
  if (predicted) size = std::max(*predicted, probe.fitted(r));
  line.rank = r;
  line.limit = limits.of(r);
  line.predicted = predicted ? *predicted : -1;
  line.fitted = predicted.has_value();
  if (const auto fit = memory_models[i].fit()) line.fit = *fit;
  size = std::max(size, size_floor);
  if (!documents() && size < size_cap) {
    // As many micro-batches as the prediction needs, evened out: the same accumulation with
    // smaller micro-batches (256 rows at 215 run as 2 x 128), so more room to spare.
    const std::int64_t count = (size_cap + size - 1) / size;
    size = (size_cap + count - 1) / count;
  }
  return size;
}

// Every rank starts at its memory model's prediction; a rank with nothing to predict from keeps
// its whole share (or the largest probe that fitted, when one ran out).
void Trainer::State::start_from_probe(const MemoryProbe& probe, double seconds) {
  std::vector<std::int64_t> sizes, failed;
  MemoryPrediction event;
  event.step = step;
  event.unit = documents() ? "token" : "row";
  event.margin = options.memory_margin;
  event.probe_attempts = probe.attempts();
  for (int r = 0; r < world; ++r) {
    MemoryPrediction::Rank line;
    sizes.push_back(predicted_size(probe, r, line));
    failed.push_back(probe.failed(r));
    event.ranks.push_back(line);
  }
  if (!micro_batches->per_rank()) {
    // Scope global: one size for every rank, the smallest prediction.
    const std::int64_t smallest = *std::min_element(sizes.begin(), sizes.end());
    sizes.assign(sizes.size(), smallest);
    std::int64_t bound = 0;
    for (std::int64_t f : failed)
      if (f > 0) bound = bound > 0 ? std::min(bound, f) : f;
    failed.assign(failed.size(), bound);
  }
  micro_batches->start_at(sizes, failed);
  for (auto& line : event.ranks)
    line.used = micro_batches->current(line.rank);
  if (documents() && options.token_cost_by_memory && !fixed_size) {
    // The budgets were predicted at the longest document's width: with --token-cost memory, a
    // piece of narrower documents may take more tokens for the same predicted peak
    // (data::WidthCost).
    costs.width_costs.assign(static_cast<std::size_t>(world), data::WidthCost{});
    for (int r = 0; r < world; ++r) {
      const auto fit = memory_models[static_cast<std::size_t>(r)].fit();
      if (fit && fit->per_unit > 0 && fit->per_square > 0)
        costs.width_costs[static_cast<std::size_t>(r)] =
            data::WidthCost{fit->per_square / fit->per_unit, size_floor};
    }
  }
  event.seconds = seconds;
  memory::release_cached_memory();
  prediction = event;
  reporter.notify([&](StepObserver& o) { o.on_prediction(event); });
}

// --balance throughput: after every step, its measured speeds; every --balance-every steps new
// shares (sizing/balance.hpp), each rank at least its micro-batch when that is fixed.
void Trainer::State::rebalance(const std::vector<std::int64_t>& step_shares,
                               const std::vector<double>& compute_seconds) {
  std::vector<std::int64_t> floors;
  if (!documents() && !micro_batches->automatic()) {
    for (int r = 0; r < world; ++r)
      floors.push_back(std::min(micro_batches->current(r), balance->total() / world));
  }
  const auto change = balance->measure(step, total_steps, step_shares, compute_seconds, floors);
  if (change) reporter.say(change->text(documents()));
}

// --balance throughput with an automatic micro-batch of rows: when the shares change, each
// rank's micro-batch follows its share. A slow rank's share may fall below the size it held (it
// then runs its share whole), and a fast rank's size grows into its larger share as far as its
// memory model predicts it fits (scope global: the smallest rank's prediction). Without a limit
// nothing bounds it but an out-of-memory, which halves as ever. Every rank computes every
// rank's sizes from the same shares and models: no collective.
void Trainer::State::follow_shares() {
  if (!sizes_follow_shares()) return;
  const std::optional<std::vector<std::int64_t>> changed = balance->to_follow(step);
  if (!changed) return;
  const std::vector<std::int64_t>& now = *changed;
  const std::int64_t widest = *std::max_element(now.begin(), now.end());
  std::vector<std::optional<std::int64_t>> predicted(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (limits.of(r) > 0)
      predicted[i] = memory_models[i].largest(limits.of(r), options.memory_margin, widest);
  }
  if (!micro_batches->per_rank()) {
    std::optional<std::int64_t> smallest;
    for (const auto& p : predicted)
      if (p) smallest = smallest ? std::min(*smallest, *p) : *p;
    if (smallest) predicted.assign(predicted.size(), smallest);
  }
  if (micro_batches->follow_shares(now, predicted).empty()) return;
  reporter.say("step " + std::to_string(step) + ": micro-batches " + micro_batches->describe() +
               " follow the rows per rank " + sizes_text(now));
}

// --dry-run: after the probe, what the user asked for: the largest global batch that runs
// without accumulation, and how this --global-batch would run.
void Trainer::State::report_dry_run() {
  const std::string units = documents() ? "tokens" : "rows";
  if (!prediction) {
    reporter.say(
        "dry run: nothing to predict against (no --memory-limit, and not on a GPU): every rank "
        "would start at its whole share, " +
        std::to_string(size_cap) + " " + units + ", and halve if it ran out of memory");
    return;
  }
  std::int64_t total = 0;
  std::vector<std::int64_t> each;
  bool capped = false;
  for (const auto& r : prediction->ranks) {
    // Without a model (one size measured) the share that was measured is what is known to fit.
    const std::int64_t fits = r.predicted >= 0 ? r.predicted : size_cap;
    capped = capped || fits >= size_cap;
    each.push_back(fits);
  }
  if (!micro_batches->per_rank() && !fixed_size) {
    const std::int64_t smallest = *std::min_element(each.begin(), each.end());
    each.assign(each.size(), smallest);
  }
  for (std::int64_t m : each)
    total += m;
  std::ostringstream line;
  line << "dry run: the largest global batch without accumulation is about " << total << " "
       << units << " (" << sizes_text(each) << " per rank"
       << (capped ? "; a rank's figure is capped at its share of this --global-batch, so it may "
                    "hold more"
                  : "")
       << ")";
  reporter.say(line.str());
  if (!documents()) {
    std::ostringstream plan_line;
    plan_line << "dry run: --global-batch " << options.global_batch
              << " would start at micro-batch " << micro_batches->describe() << " (accumulation "
              << micro_batches->accumulation(0, size_cap) << " on rank 0)";
    reporter.say(plan_line.str());
  }
}

// After an agreed out-of-memory: when some rank's model refused its size (its own error at a
// size below one that ran out), the run ends here on every rank with one line naming the lowest
// such rank, exit 3; otherwise nothing happens and the sizes are lowered by the caller.
void Trainer::State::fail_if_refused(const StepOutcome& outcome) {
  const std::vector<int> refused = outcome.refused();
  if (refused.empty()) return;
  // The refusing ranks' own words, agreed in one more collective (every rank enters it: each
  // read the same outcome); the lowest refusing rank's message is printed once.
  std::string mine;
  if (std::find(refused.begin(), refused.end(), rank) != refused.end()) {
    mine = "rank " + std::to_string(rank) + ": the model fails on a micro-batch of " +
           count_text(refusals.size()) + " (out of memory at " +
           std::to_string(refusals.refused_after()) + ", limit " + limits.text({rank}) +
           "): " + last_line(refusals.what()) +
           "; it needs a larger micro-batch than the memory leaves room for: raise "
           "--memory-limit, use more memory per rank or a smaller model";
  }
  const auto agreed = comm::agree_on_failure(comm, mine, static_cast<int>(ExitCode::kOutOfMemory));
  const std::string message = agreed ? agreed->message : "a model error on a smaller micro-batch";
  finish("failed", message);
  if (agreed) comm::throw_collective(comm, *agreed);
  throw CollectiveError(message, ExitCode::kOutOfMemory, 0);
}

void Trainer::State::after_out_of_memory(const StepOutcome& outcome) {
  fail_if_refused(outcome);
  OomEvent event;
  event.step = step;
  event.ranks = outcome.out_of_memory;
  event.ranks_text = outcome.ranks_text();
  event.where_text = outcome.phases_text();
  for (int r : event.ranks) {
    event.micro_batches.push_back(micro_batches->current(r));
    event.probe = event.probe || micro_batches->probing(r);
  }
  const bool can_shrink = micro_batches->after_oom(event.ranks);
  if (can_shrink) {
    for (int r : event.ranks)
      event.next.push_back(micro_batches->current(r));
  }
  event.per_rank = micro_batches->per_rank();
  event.tokens = documents();
  event.world = world;
  event.limit_text = limits.text(event.ranks);
  result.oom_events += static_cast<std::int64_t>(event.ranks.size());
  reporter.notify([&](StepObserver& o) { o.on_oom(event); });
  if (!can_shrink) {
    std::int64_t worst_peak = 0;
    for (int r : event.ranks)
      worst_peak = std::max(worst_peak, outcome.peak_bytes[static_cast<std::size_t>(r)]);
    std::ostringstream message;
    message << event.ranks_text << " ran out of memory at "
            << (documents() ? "token budget " : "micro-batch ") << sizes_text(event.micro_batches)
            << event.where_text << " (limit " << event.limit_text << ", peak "
            << memory::format_bytes(worst_peak) << ") at step " << step << ": ";
    if (micro_batches->automatic() && documents()) {
      const auto& lengths = reader->schema().lengths;
      const auto longest = std::max_element(lengths.begin(), lengths.end());
      message << "the longest document (" << (longest - lengths.begin()) << ", " << *longest
              << " tokens) does not fit even alone; split long documents (autoaccum import text "
                 "--documents --max-length N), raise --memory-limit or use a smaller model";
    } else if (micro_batches->automatic()) {
      message << "the model does not fit even at micro-batch 1; raise --memory-limit, use more "
                 "ranks or a smaller model";
    } else if (documents()) {
      message << "--micro-batch-tokens " << event.micro_batches.front()
              << " is fixed; use --micro-batch-tokens auto to let autoaccum find a budget that "
                 "fits";
    } else {
      message << "--micro-batch " << event.micro_batches.front()
              << " is fixed; use --micro-batch auto to let autoaccum find a size that fits";
    }
    fail_run(message.str(), ExitCode::kOutOfMemory);
  }
  memory::release_cached_memory();
}

}  // namespace autoaccum::train
