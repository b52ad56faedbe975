// Trainer's time concern (documents, --micro-batch-cost auto): the time probe before the first
// step, which times pieces of each rank's share at several shapes and fits what a micro-batch
// takes (train::TimeFit), so that every rank's documents are cut by predicted time.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>

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
           data::plan_documents(share, b, width_cost(r), line.fit->piece_cost()).pieces)
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

// After the memory probe (or at a fixed budget), before the first step: each rank times pieces
// of its own share at its budget, each rolled back like the memory probe's, in attempts every rank
// joins (the timings travel in each attempt's own all-reduce, so every rank fits every rank's
// model alike and no collective is added):
//   - the budget's piece padded to the data's longest width (data::widen_piece), once untimed
//     first (a graph's first call at a shape compiles and allocates);
//   - a quarter of the budget at that width: with the first, the cost per padded token there;
//   - the budget spent on the share's shorter documents (data::narrow_piece; none when its
//     documents are alike in length): what a narrow token costs against a wide one;
//   - one short document alone (data::short_piece): mostly a micro-batch's own cost.
// Each timed shape runs twice and keeps its faster time (a timing is never too fast, only
// delayed). A piece that runs out of memory lowers the budget as a step's would, and is not timed.
void Trainer::State::probe_time(const data::Batch& slab) {
  if (!time_pending) return;
  time_pending = false;
  const auto start = Clock::now();
  struct Piece {
    ProbePiece piece;
    bool quarter;  // a quarter of the budget
    bool timed;
  };
  const Piece warm{ProbePiece::kFirstPiece, false, false};
  const Piece pieces[] = {{ProbePiece::kFirstPiece, false, true},
                          {ProbePiece::kFirstPiece, true, true},
                          {ProbePiece::kNarrowPiece, false, true},
                          {ProbePiece::kShortPiece, false, true}};
  std::vector<Piece> order{warm};
  for (int round = 0; round < 2; ++round)
    order.insert(order.end(), std::begin(pieces), std::end(pieces));

  // Per rank: each shape measured (units, square) and its fastest time.
  std::vector<std::map<std::pair<double, double>, double>> fastest(static_cast<std::size_t>(world));
  std::int64_t attempts = 0;
  bool stopped = false;
  for (const Piece& p : order) {
    const std::int64_t budget = micro_batches->current(rank);
    const std::int64_t m = p.quarter ? std::max(size_floor, budget / 4) : budget;
    const StepOutcome outcome = attempt(slab, m, p.piece);
    ++attempts;
    fail_if_refused(outcome);
    if (outcome.abandoned || outcome.stop) {
      stopped = true;  // a stop signal: the step loop stops
      break;
    }
    if (!outcome.out_of_memory.empty()) {
      after_out_of_memory(outcome);
      continue;
    }
    if (!p.timed) continue;
    for (std::size_t i = 0; i < fastest.size(); ++i) {
      const MicroBatchShape shape = outcome.peak_shapes[i];
      const double seconds = outcome.compute_seconds[i];
      if (!(shape.units > 0) || !(seconds > 0)) continue;  // no such piece on this rank
      auto [it, added] = fastest[i].try_emplace({shape.units, shape.square}, seconds);
      if (!added) it->second = std::min(it->second, seconds);
    }
  }

  TimeProbe event;
  event.step = step;
  event.probe_attempts = attempts;
  event.widest = size_floor;
  time_fits.assign(static_cast<std::size_t>(world), std::nullopt);
  for (int r = 0; r < world && !stopped; ++r) {
    const auto i = static_cast<std::size_t>(r);
    std::vector<std::pair<MicroBatchShape, double>> timed;
    for (const auto& [shape, seconds] : fastest[i])
      timed.push_back({MicroBatchShape{shape.first, shape.second}, seconds});
    TimeProbe::Rank line;
    line.rank = r;
    line.budget = micro_batches->current(r);
    line.fit = fit_time(timed);
    if (line.fit) {
      line.error = 0;
      for (const auto& [shape, seconds] : timed)
        line.error = std::max(line.error, std::abs(line.fit->predict(shape) / seconds - 1));
    }
    time_fits[i] = line.fit;
    if (line.fit) predict_steps(r, line);
    event.ranks.push_back(line);
  }
  event.seconds = seconds_since(start);
  memory::release_cached_memory();
  if (!stopped) notify([&](StepObserver& o) { o.on_time_probe(event); });
}

}  // namespace autoaccum::train
