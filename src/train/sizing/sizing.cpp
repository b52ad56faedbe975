// Sizing: every rank's micro-batch policy, limits and memory models, the probes' outcomes, what
// follows an agreed out-of-memory (lower the sizes, or end the run in one line), the shares
// automatic sizes follow, and sizing's part of checkpoints (sizing/sizing.hpp; docs/design.md).
#include "autoaccum/train/sizing/sizing.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/sizing/time_model.hpp"

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

Sizing::Sizing(const TrainOptions& options, comm::Communicator& comm, DataFeed& feed)
    : options_(options),
      comm_(comm),
      feed_(feed),
      rank_(comm.rank()),
      world_(comm.size()),
      limits_(options.memory_limit, options.memory_limits) {}

void Sizing::gather_limits(std::int64_t mine) {
  limits_.gather(comm_, mine);
  memory_models_.assign(static_cast<std::size_t>(world_), MemoryModel{});
}

void Sizing::start(const std::vector<std::int64_t>& resumed) {
  const SizeBounds& sizes = feed_.sizes();
  // --micro-batch-search predict with a limit to predict against: probe before the first step
  // (a prediction that does not fit then halves, as halve does). --dry-run probes whenever it
  // can: what fits is all it reports.
  memory_probe_pending_ = ((options_.predict_micro_batch && !sizes.fixed) || options_.dry_run) &&
                          limits_.known() && resumed.empty();
  // --micro-batch-cost auto: the time probe after it, whatever the budget (a resume on the same
  // ranks takes the fits from its checkpoint instead: restore_fits clears this).
  time_probe_pending_ = feed_.cut_by_time() && !options_.dry_run;
  micro_batches_ = std::make_unique<RankMicroBatches>(world_, sizes.cap, sizes.fixed, resumed,
                                                      options_.refine_micro_batch,
                                                      options_.micro_batch_per_rank, sizes.floor);
  micro_batches_->set_regrow(regrow_steps());
}

std::int64_t Sizing::regrow_steps() const {
  if (options_.micro_batch_regrow >= 0) return options_.micro_batch_regrow;
  return options_.predict_micro_batch ? 100 : 0;
}

std::optional<MemoryProbe::Setup> Sizing::take_memory_probe() {
  if (!memory_probe_pending_) return std::nullopt;
  memory_probe_pending_ = false;
  const bool documents = feed_.documents();
  MemoryProbe::Setup setup;
  setup.world = world_;
  setup.documents = documents;
  // Rows: at least 2, since BatchNorm cannot train on one row. Documents: the longest document.
  setup.low = documents ? feed_.sizes().floor : std::min<std::int64_t>(2, feed_.sizes().cap);
  setup.size_cap = feed_.sizes().cap;
  setup.narrow_point = documents && options_.token_cost_by_memory;
  setup.limits = limits_.all();
  return setup;
}

bool Sizing::take_time_probe() {
  const bool pending = time_probe_pending_;
  time_probe_pending_ = false;
  return pending;
}

void Sizing::drop_time_fits() {
  costs_.time_fits.assign(static_cast<std::size_t>(world_), std::nullopt);
}

void Sizing::learn(const AttemptOutcome& outcome) {
  for (int r = 0; r < world_; ++r) {
    const auto i = static_cast<std::size_t>(r);
    MemoryModel& memory = memory_models_[i];
    memory.set_base(outcome.base_bytes[i]);
    const bool ran_out = std::find(outcome.out_of_memory.begin(), outcome.out_of_memory.end(), r) !=
                         outcome.out_of_memory.end();
    if (ran_out)
      memory.ran_out(outcome.peak_shapes[i]);
    else if (!outcome.abandoned)
      memory.observe(outcome.peak_shapes[i], outcome.peak_bytes[i]);
  }
}

// The state the model keeps whatever the micro-batch leaves no room: one line, before halving to
// sizes that cannot help.
void Sizing::fail_nothing_fits(const MemoryProbe& probe, const AttemptOutcome& outcome) const {
  const std::vector<int>& nothing_fits = probe.nothing_fits();
  std::int64_t peak = 0;
  for (int r : nothing_fits)
    peak = std::max(peak, outcome.peak_bytes[static_cast<std::size_t>(r)]);
  std::ostringstream message;
  message << ranks_text(nothing_fits) << " ran out of memory on a micro-batch of "
          << feed_.count_text(probe.low()) << " while probing memory before the first step ("
          << limits_.text(nothing_fits) << ", peak " << memory::format_bytes(peak)
          << "): the model's parameters, gradients and optimizer state leave no room for "
             "its activations; raise --memory-limit, use more memory per rank or a smaller "
             "model"
          << (options_.optimizer == "adamw" ? ", or --optimizer sgd (no moment buffers)" : "");
  throw CollectiveError(message.str(), ExitCode::kOutOfMemory, 0);
}

// Rank r's starting size from its memory model (and the probe's sizes), with its line of the
// prediction.
std::int64_t Sizing::predicted_size(const MemoryProbe& probe, int r,
                                    MemoryPrediction::Rank& line) const {
  const auto i = static_cast<std::size_t>(r);
  const SizeBounds& bounds = feed_.sizes();
  const double width = feed_.documents() ? static_cast<double>(bounds.floor) : 0.0;
  const auto predicted =
      memory_models_[i].largest(limits_.of(r), options_.memory_margin, bounds.cap, width);
  std::int64_t size = predicted ? *predicted : probe.failed(r) > 0 ? probe.fitted(r) : bounds.cap;
  // A size the probe measured is kept even when the margin says less.
  if (predicted) size = std::max(*predicted, probe.fitted(r));
  line.rank = r;
  line.limit = limits_.of(r);
  line.predicted = predicted ? *predicted : -1;
  line.fitted = predicted.has_value();
  if (const auto fit = memory_models_[i].fit()) line.fit = *fit;
  size = std::max(size, bounds.floor);
  if (!feed_.documents() && size < bounds.cap) {
    // As many micro-batches as the prediction needs, evened out: the same accumulation with
    // smaller micro-batches (256 rows at 215 run as 2 x 128), so more room to spare.
    const std::int64_t count = (bounds.cap + size - 1) / size;
    size = (bounds.cap + count - 1) / count;
  }
  return size;
}

// A rank with nothing to predict from keeps its whole share (or the largest probe that fitted,
// when one ran out).
MemoryPrediction Sizing::start_from_probe(const MemoryProbe& probe, double seconds,
                                          std::int64_t step) {
  std::vector<std::int64_t> sizes, failed;
  MemoryPrediction event;
  event.step = step;
  event.unit = feed_.documents() ? "token" : "row";
  event.margin = options_.memory_margin;
  event.probe_attempts = probe.attempts();
  for (int r = 0; r < world_; ++r) {
    MemoryPrediction::Rank line;
    sizes.push_back(predicted_size(probe, r, line));
    failed.push_back(probe.failed(r));
    event.ranks.push_back(line);
  }
  if (!micro_batches_->per_rank()) {
    // Scope global: one size for every rank, the smallest prediction.
    const std::int64_t smallest = *std::min_element(sizes.begin(), sizes.end());
    sizes.assign(sizes.size(), smallest);
    std::int64_t bound = 0;
    for (std::int64_t f : failed)
      if (f > 0) bound = bound > 0 ? std::min(bound, f) : f;
    failed.assign(failed.size(), bound);
  }
  micro_batches_->start_at(sizes, failed);
  for (auto& line : event.ranks)
    line.used = micro_batches_->current(line.rank);
  if (feed_.documents() && options_.token_cost_by_memory && !feed_.sizes().fixed) {
    // The budgets were predicted at the longest document's width: with --token-cost memory, a
    // piece of narrower documents may take more tokens for the same predicted peak
    // (data::WidthCost).
    costs_.width_costs.assign(static_cast<std::size_t>(world_), data::WidthCost{});
    for (int r = 0; r < world_; ++r) {
      const auto fit = memory_models_[static_cast<std::size_t>(r)].fit();
      if (fit && fit->per_unit > 0 && fit->per_square > 0)
        costs_.width_costs[static_cast<std::size_t>(r)] =
            data::WidthCost{fit->per_square / fit->per_unit, feed_.sizes().floor};
    }
  }
  event.seconds = seconds;
  memory::release_cached_memory();
  prediction_ = event;
  return event;
}

// What rank r's fit predicts for its compute per step over the next steps' shares (at most 8),
// cut under its budget and under half of it. Under a cost of a micro-batch plus its padded tokens
// a larger budget never predicts slower (every cut a smaller budget allows, it allows too), so
// an automatic budget stays the largest predicted to fit; the pair says by how much that pays.
// From the documents' lengths alone, which every rank holds: every rank computes every rank's.
void Sizing::predict_steps(std::int64_t step, int r, TimeProbe::Rank& line) const {
  const auto& lengths = feed_.reader().schema().lengths;
  const std::int64_t budget = micro_batches_->current(r);
  const std::int64_t floor = feed_.sizes().floor;
  const auto i = static_cast<std::size_t>(r);
  double at_budget = 0, at_half = 0;
  const std::int64_t steps = std::min<std::int64_t>(8, feed_.total_steps() - step);
  for (std::int64_t s = step; s < step + steps; ++s) {
    const StepSplit split = feed_.split_of(s);
    const std::vector<std::int64_t> share(
        lengths.begin() + split.batch.begin + split.offsets[i],
        lengths.begin() + split.batch.begin + split.offsets[i + 1]);
    const auto predict = [&](std::int64_t b) {
      double seconds = 0;
      for (const auto& piece :
           data::plan_documents(share, b, costs_.width_cost(r), line.fit->piece_cost()).pieces)
        seconds += line.fit->predict(piece_shape(piece));
      return seconds;
    };
    at_budget += predict(budget);
    if (budget / 2 >= floor) at_half += predict(budget / 2);
  }
  if (steps <= 0) return;
  line.steps = steps;
  line.step_seconds = at_budget / static_cast<double>(steps);
  if (budget / 2 >= floor) line.half_step_seconds = at_half / static_cast<double>(steps);
}

TimeProbe Sizing::fit_times(const TimeProbeSchedule& probe, double seconds, std::int64_t step) {
  TimeProbe event;
  event.step = step;
  event.probe_attempts = probe.attempts();
  event.widest = feed_.sizes().floor;
  drop_time_fits();
  for (int r = 0; r < world_; ++r) {
    const std::vector<std::pair<MicroBatchShape, double>> timed = probe.timed(r);
    TimeProbe::Rank line;
    line.rank = r;
    line.budget = micro_batches_->current(r);
    line.fit = fit_time(timed);
    if (line.fit) {
      line.error = 0;
      for (const auto& [shape, took] : timed)
        line.error = std::max(line.error, std::abs(line.fit->predict(shape) / took - 1));
    }
    costs_.time_fits[static_cast<std::size_t>(r)] = line.fit;
    if (line.fit) predict_steps(step, r, line);
    event.ranks.push_back(line);
  }
  event.seconds = seconds;
  memory::release_cached_memory();
  return event;
}

// When some rank's model refused its size (its own error at a size below one that ran out), the
// run ends here on every rank with one line naming the lowest such rank, exit 3; otherwise
// nothing happens and the sizes are lowered by after_out_of_memory.
void Sizing::fail_if_refused(const AttemptOutcome& outcome) {
  const std::vector<int> refused = outcome.refused();
  if (refused.empty()) return;
  // The refusing ranks' own words, agreed in one more collective (every rank enters it: each
  // read the same outcome); the lowest refusing rank's message is printed once.
  std::string mine;
  if (std::find(refused.begin(), refused.end(), rank_) != refused.end()) {
    mine = "rank " + std::to_string(rank_) + ": the model fails on a micro-batch of " +
           feed_.count_text(refusals_.size()) + " (out of memory at " +
           std::to_string(refusals_.refused_after()) + ", limit " + limits_.text({rank_}) +
           "): " + last_line(refusals_.what()) +
           "; it needs a larger micro-batch than the memory leaves room for: raise "
           "--memory-limit, use more memory per rank or a smaller model";
  }
  const auto agreed = comm::agree_on_failure(comm_, mine, static_cast<int>(ExitCode::kOutOfMemory));
  if (agreed) comm::throw_collective(comm_, *agreed);
  throw CollectiveError("a model error on a smaller micro-batch", ExitCode::kOutOfMemory, 0);
}

Sizing::OutOfMemory Sizing::after_out_of_memory(const AttemptOutcome& outcome, std::int64_t step) {
  fail_if_refused(outcome);
  OutOfMemory result;
  OomEvent& event = result.event;
  event.step = step;
  event.ranks = outcome.out_of_memory;
  event.ranks_text = outcome.ranks_text();
  event.where_text = outcome.phases_text();
  for (int r : event.ranks) {
    event.micro_batches.push_back(micro_batches_->current(r));
    event.probe = event.probe || micro_batches_->probing(r);
  }
  const bool can_shrink = micro_batches_->after_oom(event.ranks);
  if (can_shrink) {
    for (int r : event.ranks)
      event.next.push_back(micro_batches_->current(r));
  }
  event.per_rank = micro_batches_->per_rank();
  event.tokens = feed_.documents();
  event.world = world_;
  event.limit_text = limits_.text(event.ranks);
  if (!can_shrink) result.failure = failure_text(event, outcome, step);
  memory::release_cached_memory();
  return result;
}

// Nothing can shrink: what ran out where, and what the user can do.
std::string Sizing::failure_text(const OomEvent& event, const AttemptOutcome& outcome,
                                 std::int64_t step) const {
  const bool documents = feed_.documents();
  std::int64_t worst_peak = 0;
  for (int r : event.ranks)
    worst_peak = std::max(worst_peak, outcome.peak_bytes[static_cast<std::size_t>(r)]);
  std::ostringstream message;
  message << event.ranks_text << " ran out of memory at "
          << (documents ? "token budget " : "micro-batch ") << sizes_text(event.micro_batches)
          << event.where_text << " (limit " << event.limit_text << ", peak "
          << memory::format_bytes(worst_peak) << ") at step " << step << ": ";
  if (micro_batches_->automatic() && documents) {
    const auto& lengths = feed_.reader().schema().lengths;
    const auto longest = std::max_element(lengths.begin(), lengths.end());
    message << "the longest document (" << (longest - lengths.begin()) << ", " << *longest
            << " tokens) does not fit even alone; split long documents (autoaccum import text "
               "--documents --max-length N), raise --memory-limit or use a smaller model";
  } else if (micro_batches_->automatic()) {
    message << "the model does not fit even at micro-batch 1; raise --memory-limit, use more "
               "ranks or a smaller model";
  } else if (documents) {
    message << "--micro-batch-tokens " << event.micro_batches.front()
            << " is fixed; use --micro-batch-tokens auto to let autoaccum find a budget that "
               "fits";
  } else {
    message << "--micro-batch " << event.micro_batches.front()
            << " is fixed; use --micro-batch auto to let autoaccum find a size that fits";
  }
  return message.str();
}

std::vector<std::string> Sizing::after_success(std::int64_t step) {
  const std::vector<int> probing = micro_batches_->after_success();
  const auto what = [&](int r) {
    return micro_batches_->regrowing(r)
               ? "tries micro-batch " + std::to_string(micro_batches_->current(r)) +
                     " again after " + std::to_string(regrow_steps()) +
                     " clean steps (--micro-batch-regrow)"
               : "probes micro-batch " + std::to_string(micro_batches_->current(r));
  };
  std::vector<std::string> lines;
  if (!probing.empty() && !micro_batches_->per_rank())
    lines.push_back("every rank " + what(probing.front()) + " at step " + std::to_string(step));
  for (int r : micro_batches_->per_rank() ? probing : std::vector<int>{})
    lines.push_back("rank " + std::to_string(r) + " " + what(r) + " at step " +
                    std::to_string(step));
  return lines;
}

// Every --balance-every steps new shares (sizing/balance.hpp), each rank at least its
// micro-batch when that is fixed.
std::optional<std::string> Sizing::rebalance(std::int64_t step,
                                             const std::vector<std::int64_t>& step_shares,
                                             const std::vector<double>& compute_seconds) {
  Balance& balance = feed_.balance();
  std::vector<std::int64_t> floors;
  if (!feed_.documents() && !micro_batches_->automatic()) {
    for (int r = 0; r < world_; ++r)
      floors.push_back(std::min(micro_batches_->current(r), balance.total() / world_));
  }
  const auto change =
      balance.measure(step, feed_.total_steps(), step_shares, compute_seconds, floors);
  if (!change) return std::nullopt;
  return change->text(feed_.documents());
}

bool Sizing::sizes_follow_shares() const {
  return options_.balance && !feed_.documents() && micro_batches_->automatic();
}

// A slow rank's share may fall below the size it held (it then runs its share whole), and a fast
// rank's size grows into its larger share as far as its memory model predicts it fits (scope
// global: the smallest rank's prediction). Without a limit nothing bounds it but an
// out-of-memory, which halves as ever. Every rank computes every rank's sizes from the same
// shares and models: no collective.
std::optional<std::string> Sizing::follow_shares(std::int64_t step) {
  if (!sizes_follow_shares()) return std::nullopt;
  const std::optional<std::vector<std::int64_t>> changed = feed_.balance().to_follow(step);
  if (!changed) return std::nullopt;
  const std::vector<std::int64_t>& now = *changed;
  const std::int64_t widest = *std::max_element(now.begin(), now.end());
  std::vector<std::optional<std::int64_t>> predicted(static_cast<std::size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (limits_.of(r) > 0)
      predicted[i] = memory_models_[i].largest(limits_.of(r), options_.memory_margin, widest);
  }
  if (!micro_batches_->per_rank()) {
    std::optional<std::int64_t> smallest;
    for (const auto& p : predicted)
      if (p) smallest = smallest ? std::min(*smallest, *p) : *p;
    if (smallest) predicted.assign(predicted.size(), smallest);
  }
  if (micro_batches_->follow_shares(now, predicted).empty()) return std::nullopt;
  return "step " + std::to_string(step) + ": micro-batches " + micro_batches_->describe() +
         " follow the rows per rank " + sizes_text(now);
}

std::vector<std::string> Sizing::dry_run_lines() const {
  const std::string units = feed_.documents() ? "tokens" : "rows";
  const std::int64_t cap = feed_.sizes().cap;
  if (!prediction_) {
    return {
        "dry run: nothing to predict against (no --memory-limit, and not on a GPU): every "
        "rank would start at its whole share, " +
        std::to_string(cap) + " " + units + ", and halve if it ran out of memory"};
  }
  std::int64_t total = 0;
  std::vector<std::int64_t> each;
  bool capped = false;
  for (const auto& r : prediction_->ranks) {
    // Without a model (one size measured) the share that was measured is what is known to fit.
    const std::int64_t fits = r.predicted >= 0 ? r.predicted : cap;
    capped = capped || fits >= cap;
    each.push_back(fits);
  }
  if (!micro_batches_->per_rank() && !feed_.sizes().fixed) {
    const std::int64_t smallest = *std::min_element(each.begin(), each.end());
    each.assign(each.size(), smallest);
  }
  for (std::int64_t m : each)
    total += m;
  std::vector<std::string> lines;
  std::ostringstream line;
  line << "dry run: the largest global batch without accumulation is about " << total << " "
       << units << " (" << sizes_text(each) << " per rank"
       << (capped ? "; a rank's figure is capped at its share of this --global-batch, so it may "
                    "hold more"
                  : "")
       << ")";
  lines.push_back(line.str());
  if (!feed_.documents()) {
    std::ostringstream plan_line;
    plan_line << "dry run: --global-batch " << options_.global_batch
              << " would start at micro-batch " << micro_batches_->describe() << " (accumulation "
              << micro_batches_->accumulation(0, cap) << " on rank 0)";
    lines.push_back(plan_line.str());
  }
  return lines;
}

void Sizing::record(io::Checkpoint& c) const {
  c.micro_batch = micro_batches_->current(0);
  c.micro_batches = micro_batches_->sizes();
  if (sizes_follow_shares()) c.shares_followed = feed_.balance().followed();
  for (std::size_t r = 0; r < memory_models_.size(); ++r) {
    const MemoryModel::Record m = memory_models_[r].record();
    c.memory_models.push_back(
        {m.points, m.failed_units, m.base, costs_.width_cost(static_cast<int>(r)).ratio});
  }
  for (const auto& fit : costs_.time_fits)
    c.time_fits.push_back(
        fit ? io::Checkpoint::TimeFitRecord{fit->fixed, fit->per_unit, fit->per_square}
            : io::Checkpoint::TimeFitRecord{});
}

// What fits on a rank depends on its memory and the model, not on how many ranks share the
// batch: on the same ranks each continues at its own size; on another number of ranks the sizes
// are kept where they were equal, and with per-rank sizes (which belong to ranks that may no
// longer exist) every rank starts from the largest and halves where it must. Capped by the new
// per-rank batch either way. Returns the sizes it continues at.
std::vector<std::int64_t> Sizing::restore_sizes(const io::Checkpoint& c, std::string& note) {
  std::vector<std::int64_t> saved = c.micro_batches;
  if (saved.empty() && c.micro_batch > 0) saved.push_back(c.micro_batch);
  const std::int64_t cap = feed_.sizes().cap;
  if (!saved.empty() && c.world_size != world_) {
    const std::int64_t largest = *std::max_element(saved.begin(), saved.end());
    const bool equal =
        std::all_of(saved.begin(), saved.end(), [&](std::int64_t m) { return m == saved.front(); });
    note =
        "the checkpoint was written by " + std::to_string(c.world_size) + " rank(s); now " +
        std::to_string(world_) + ": " +
        (equal ? "every rank keeps micro-batch " + std::to_string(largest)
               : "per-rank micro-batches (" + sizes_text(saved) +
                     ") do not map onto other ranks: every rank starts at " +
                     std::to_string(largest) + " and halves where it runs out of memory") +
        (largest > cap ? " (capped at the new per-rank batch, " + std::to_string(cap) + ")" : "");
    saved = {largest};
  } else if (!saved.empty() && static_cast<int>(saved.size()) != world_) {
    saved = {*std::max_element(saved.begin(), saved.end())};
  }
  start(saved);
  return saved;
}

// The memory models and the documents' width costs continue on the same ranks, so the resumed
// run predicts, regrows and cuts documents as the interrupted one would have. On another number
// of ranks they belong to ranks that may not exist: learned again from the attempts.
void Sizing::restore_fits(const io::Checkpoint& c) {
  const bool documents = feed_.documents();
  if (c.world_size == world_ && static_cast<int>(c.memory_models.size()) == world_ &&
      memory_models_.size() == c.memory_models.size()) {
    costs_.width_costs.assign(static_cast<std::size_t>(world_), data::WidthCost{});
    for (std::size_t r = 0; r < memory_models_.size(); ++r) {
      const auto& m = c.memory_models[r];
      memory_models_[r] = MemoryModel::from_record({m.points, m.failed_units, m.base});
      if (documents && !feed_.sizes().fixed && options_.token_cost_by_memory && m.width_ratio > 0)
        costs_.width_costs[r] = data::WidthCost{m.width_ratio, feed_.sizes().floor};
    }
  }
  // --micro-batch-cost auto: the time fits continue on the same ranks, so the resumed run cuts as
  // the interrupted one did (no time probe); on another number of ranks they are probed again.
  if (c.world_size == world_ && static_cast<int>(c.time_fits.size()) == world_ &&
      feed_.cut_by_time()) {
    drop_time_fits();
    for (std::size_t r = 0; r < c.time_fits.size(); ++r) {
      const auto& f = c.time_fits[r];
      if (f.per_unit > 0) costs_.time_fits[r] = TimeFit{f.fixed, f.per_unit, f.per_square};
    }
    time_probe_pending_ = false;
  }
}

// The recorded sizes follow the shares they last followed (the step before's, when a change
// applies from this step; checkpoints older than shares_followed: taken to be this step's). They
// follow again only when the shares change, as in the interrupted run (a resumed run that
// followed them afresh would start from what its memory models say now, not from the sizes it
// had). A size grown past the even share into a larger one is kept: the share, not the even
// split, is its cap.
void Sizing::resume_shares(const std::vector<std::int64_t>& saved) {
  if (!feed_.documents() && static_cast<int>(saved.size()) == world_)
    micro_batches_->resume_shares(feed_.balance().followed(), saved);
}

}  // namespace autoaccum::train
