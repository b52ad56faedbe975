// Trainer's time concern (documents, --micro-batch-cost auto): each rank's fit of what a
// micro-batch takes (train::TimeFit) from the time probe's timings (time_probe.hpp), so that every
// rank's documents are cut by predicted time.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "autoaccum/memory/memory.hpp"

#include "../trainer_state.hpp"

namespace autoaccum::train {

// What rank r's fit predicts for its compute per step over the next steps' shares (at most 8),
// cut under its budget and under half of it. Under a cost of a micro-batch plus its padded tokens
// a larger budget never predicts slower (every cut a smaller budget allows, it allows too), so
// an automatic budget stays the largest predicted to fit; the pair says by how much that pays.
// From the documents' lengths alone, which every rank holds: every rank computes every rank's.
void Trainer::State::predict_steps(int r, TimeProbe::Rank& line) const {
  const auto& lengths = reader->schema().lengths;
  const std::int64_t budget = micro_batches->current(r);
  const auto i = static_cast<std::size_t>(r);
  double at_budget = 0, at_half = 0;
  const std::int64_t steps = std::min<std::int64_t>(8, total_steps - step);
  for (std::int64_t s = step; s < step + steps; ++s) {
    const StepSplit split = split_of(s);
    const std::vector<std::int64_t> share(
        lengths.begin() + split.batch.begin + split.offsets[i],
        lengths.begin() + split.batch.begin + split.offsets[i + 1]);
    const auto predict = [&](std::int64_t b) {
      double seconds = 0;
      for (const auto& piece :
           data::plan_documents(share, b, costs.width_cost(r), line.fit->piece_cost()).pieces)
        seconds += line.fit->predict(piece_shape(piece));
      return seconds;
    };
    at_budget += predict(budget);
    if (budget / 2 >= size_floor) at_half += predict(budget / 2);
  }
  if (steps <= 0) return;
  line.steps = steps;
  line.step_seconds = at_budget / static_cast<double>(steps);
  if (budget / 2 >= size_floor) line.half_step_seconds = at_half / static_cast<double>(steps);
}

// Every rank's time fit from the probe's timings (time_probe.hpp; the step drives it), and the
// compute per step it predicts.
void Trainer::State::fit_times(const TimeProbeSchedule& probe, double probe_seconds) {
  TimeProbe event;
  event.step = step;
  event.probe_attempts = probe.attempts();
  event.widest = size_floor;
  costs.time_fits.assign(static_cast<std::size_t>(world), std::nullopt);
  for (int r = 0; r < world; ++r) {
    const std::vector<std::pair<MicroBatchShape, double>> timed = probe.timed(r);
    TimeProbe::Rank line;
    line.rank = r;
    line.budget = micro_batches->current(r);
    line.fit = fit_time(timed);
    if (line.fit) {
      line.error = 0;
      for (const auto& [shape, seconds] : timed)
        line.error = std::max(line.error, std::abs(line.fit->predict(shape) / seconds - 1));
    }
    costs.time_fits[static_cast<std::size_t>(r)] = line.fit;
    if (line.fit) predict_steps(r, line);
    event.ranks.push_back(line);
  }
  event.seconds = probe_seconds;
  memory::release_cached_memory();
  reporter.notify([&](StepObserver& o) { o.on_time_probe(event); });
}

}  // namespace autoaccum::train
