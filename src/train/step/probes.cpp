// The step drives the probes before the first step: each probe says what every rank attempts
// next, the step runs that attempt (rolled back) and hands the probe the agreed outcome
// (sizing/memory_probe.hpp, sizing/time_probe.hpp). A stop signal while probing ends the probe:
// the step loop then stops.
#include <torch/torch.h>

#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/sizing/memory_probe.hpp"
#include "autoaccum/train/sizing/time_probe.hpp"

#include "../trainer_state.hpp"

namespace autoaccum::train {

// --micro-batch-search predict (and --dry-run): before the first step only; every rank then
// starts at the size its memory model predicts (Sizing::start_from_probe).
void Trainer::State::run_memory_probe(const data::Batch& slab) {
  const std::optional<MemoryProbe::Setup> setup = sizing.take_memory_probe();
  if (!setup) return;
  const auto start = Clock::now();
  MemoryProbe probe(*setup);
  while (!probe.done()) {
    const MemoryProbe::Attempt next = probe.next(rank);
    const StepOutcome outcome = attempt(slab, next.size, next.piece);
    sizing.fail_if_refused(outcome);
    if (outcome.abandoned || outcome.stop) break;  // start without a prediction
    probe.take(outcome);
    if (!probe.nothing_fits().empty()) sizing.fail_nothing_fits(probe, outcome);
  }
  const MemoryPrediction event = sizing.start_from_probe(probe, seconds_since(start), step);
  reporter.notify([&](StepObserver& o) { o.on_prediction(event); });
}

// Documents with --micro-batch-cost auto: after the memory probe (or at a fixed budget), before
// the first step. A piece that runs out of memory lowers the budget as a step's would.
void Trainer::State::run_time_probe(const data::Batch& slab) {
  if (!sizing.take_time_probe()) return;
  const auto start = Clock::now();
  TimeProbeSchedule probe(world);
  while (!probe.done()) {
    const std::int64_t m =
        probe.next_size(sizing.micro_batches().current(rank), feed.sizes().floor);
    const StepOutcome outcome = attempt(slab, m, probe.next_piece());
    sizing.fail_if_refused(outcome);
    if (outcome.abandoned || outcome.stop) {  // no fits: the step loop stops
      sizing.drop_time_fits();
      memory::release_cached_memory();
      return;
    }
    if (!outcome.out_of_memory.empty()) after_out_of_memory(outcome);
    probe.take(outcome);
  }
  const TimeProbe event = sizing.fit_times(probe, seconds_since(start), step);
  reporter.notify([&](StepObserver& o) { o.on_time_probe(event); });
}

}  // namespace autoaccum::train
