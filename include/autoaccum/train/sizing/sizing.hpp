// Sizing: how big every rank's micro-batch is, and why. It owns every rank's micro-batch policy,
// memory limit and memory model, the record of a size the model refuses, the memory probe's
// prediction, and for documents the width costs and time fits every rank's cut weighs. The step
// drives it: it runs the attempts the probes ask for and hands over every agreed outcome; sizing
// decides and returns what the user is to be told (the events of sizing/events.hpp, lines),
// which the step passes to its observers. An end of the run it decides (nothing fits, a size the
// model refuses) is a CollectiveError every rank throws alike.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"
#include "autoaccum/io/checkpoint.hpp"
#include "autoaccum/train/options.hpp"
#include "autoaccum/train/sizing/attempt_outcome.hpp"
#include "autoaccum/train/sizing/cut_costs.hpp"
#include "autoaccum/train/sizing/data_feed.hpp"
#include "autoaccum/train/sizing/events.hpp"
#include "autoaccum/train/sizing/memory_limits.hpp"
#include "autoaccum/train/sizing/memory_model.hpp"
#include "autoaccum/train/sizing/memory_probe.hpp"
#include "autoaccum/train/sizing/micro_batch.hpp"
#include "autoaccum/train/sizing/refusals.hpp"
#include "autoaccum/train/sizing/time_probe.hpp"

namespace autoaccum::train {

class Sizing {
 public:
  // `feed` is read for the bounds, shares and lengths, and its shares' schedule is asked what
  // automatic sizes follow.
  Sizing(const TrainOptions& options, comm::Communicator& comm, DataFeed& feed);

  // Collective: every rank's limit (`mine`: this rank's, 0 for none), known on every rank.
  void gather_limits(std::int64_t mine);
  const MemoryLimits& limits() const { return limits_; }
  // Every rank's policy within the feed's bounds; `resumed`: sizes a checkpoint recorded (then
  // no probe: the run continues at them).
  void start(const std::vector<std::int64_t>& resumed);
  RankMicroBatches& micro_batches() { return *micro_batches_; }
  const RankMicroBatches& micro_batches() const { return *micro_batches_; }
  bool started() const { return micro_batches_ != nullptr; }
  const CutCosts& costs() const { return costs_; }
  Refusals& refusals() { return refusals_; }

  // The memory probe, before the first step (--micro-batch-search predict with a limit, or
  // --dry-run): its set-up once, when it is still to run.
  std::optional<MemoryProbe::Setup> take_memory_probe();
  // The smallest probe ran out on some rank: the run ends in one line.
  [[noreturn]] void fail_nothing_fits(const MemoryProbe& probe,
                                      const AttemptOutcome& outcome) const;
  // Every rank starts at its memory model's prediction (after a probe of `seconds` at `step`).
  MemoryPrediction start_from_probe(const MemoryProbe& probe, double seconds, std::int64_t step);
  const std::optional<MemoryPrediction>& prediction() const { return prediction_; }

  // The time probe (documents, --micro-batch-cost auto), after the memory probe: whether it is
  // still to run (once).
  bool take_time_probe();
  // Every rank's time fit from the probe's timings, and the compute per step it predicts.
  TimeProbe fit_times(const TimeProbeSchedule& probe, double seconds, std::int64_t step);
  void drop_time_fits();  // the probe was abandoned: cut by fewest pieces

  // Every attempt's agreed measurements feed every rank's memory model.
  void learn(const AttemptOutcome& outcome);
  // A size the model refuses ends the run on every rank with one line and exit 3 when the
  // agreed outcome names a refusing rank (collective then).
  void fail_if_refused(const AttemptOutcome& outcome);
  // After an agreed out-of-memory at `step`: the sizes lowered; `failure` set when nothing can
  // shrink (the caller tells the event, then ends the run with it).
  struct OutOfMemory {
    OomEvent event;
    std::optional<std::string> failure;
  };
  OutOfMemory after_out_of_memory(const AttemptOutcome& outcome, std::int64_t step);

  // After a step that succeeded (`step` steps done): which ranks try a larger size next (the
  // refine search, --micro-batch-regrow), a line for each.
  std::vector<std::string> after_success(std::int64_t step);

  // --balance throughput: after step `step`, its measured speeds; new shares every
  // --balance-every steps (a line saying so).
  std::optional<std::string> rebalance(std::int64_t step,
                                       const std::vector<std::int64_t>& step_shares,
                                       const std::vector<double>& compute_seconds);
  // Rows with an automatic size: when the shares changed, each rank's size follows its share
  // as far as its memory model says it fits (a line saying so).
  std::optional<std::string> follow_shares(std::int64_t step);
  bool sizes_follow_shares() const;

  // --dry-run: the largest global batch without accumulation, and how this one would run.
  std::vector<std::string> dry_run_lines() const;

  // Checkpoints: what sizing records, and what it takes back. The sizes continue on the same
  // ranks (on others, from the largest: `note` says how); the memory models, width costs and
  // time fits only on the same ranks; sizes that followed shares follow the restored shares.
  void record(io::Checkpoint& c) const;
  std::vector<std::int64_t> restore_sizes(const io::Checkpoint& c, std::string& note);
  void restore_fits(const io::Checkpoint& c);
  void resume_shares(const std::vector<std::int64_t>& saved);

 private:
  std::int64_t predicted_size(const MemoryProbe& probe, int r, MemoryPrediction::Rank& line) const;
  void predict_steps(std::int64_t step, int r, TimeProbe::Rank& line) const;
  std::int64_t regrow_steps() const;
  std::string failure_text(const OomEvent& event, const AttemptOutcome& outcome,
                           std::int64_t step) const;

  const TrainOptions& options_;
  comm::Communicator& comm_;
  DataFeed& feed_;
  int rank_, world_;
  MemoryLimits limits_;
  std::vector<MemoryModel> memory_models_;
  std::unique_ptr<RankMicroBatches> micro_batches_;
  Refusals refusals_;
  CutCosts costs_;
  std::optional<MemoryPrediction> prediction_;
  bool memory_probe_pending_ = false, time_probe_pending_ = false;
};

}  // namespace autoaccum::train
