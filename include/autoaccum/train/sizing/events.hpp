// What sizing decides that the user is told of: an agreed out-of-memory and the probes' outcomes
// (the step passes them on to its observers, step/reporter.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autoaccum/train/sizing/memory_model.hpp"
#include "autoaccum/train/sizing/time_model.hpp"

namespace autoaccum::train {

// An agreed out-of-memory: every rank builds the same event from the reduced flags.
struct OomEvent {
  std::int64_t step = 0;
  std::vector<int> ranks;  // those that ran out
  std::string ranks_text;  // "rank 1" / "ranks 0, 2"
  std::string where_text;  // " in backward" / " (rank 0 in forward, rank 1 in backward)"
  std::vector<std::int64_t> micro_batches;  // aligned with `ranks`: the size each ran out at
  std::vector<std::int64_t> next;  // aligned with `ranks`: each one's next size; empty: the run
                                   // cannot shrink further and stops
  bool per_rank = false;           // --micro-batch-scope rank: the other ranks keep their sizes
  bool probe = false;              // the size was a refine probe
  bool tokens = false;             // document data: the sizes are token budgets
  std::int64_t world = 1;
  std::string limit_text;  // "16.0 MiB per rank" | "no --memory-limit"
};

// The memory probe's outcome (--micro-batch-search predict): every rank's fitted memory model
// and the micro-batch it starts at; every rank builds the same event.
struct MemoryPrediction {
  std::int64_t step = 0;
  std::string unit = "row";  // "row" or "token" (document budgets)
  double margin = 0;         // --memory-margin
  std::int64_t probe_attempts = 0;
  double seconds = 0;  // the probe's time
  struct Rank {
    int rank = 0;
    std::int64_t limit = 0;      // bytes (0: none)
    bool fitted = false;         // a model could be fitted
    MemoryFit fit;               // when fitted
    std::int64_t predicted = 0;  // its largest size under the limit and margin (-1: none)
    std::int64_t used = 0;       // the size it starts at (scope global: the smallest)
  };
  std::vector<Rank> ranks;
};

// The time probe's outcome (documents, --micro-batch-cost auto): every rank's fitted compute time
// per micro-batch, which the planner cuts its documents by; every rank builds the same event.
struct TimeProbe {
  std::int64_t step = 0;
  std::int64_t probe_attempts = 0;
  double seconds = 0;       // the probe's time
  std::int64_t widest = 0;  // the data's longest document
  struct Rank {
    int rank = 0;
    std::optional<TimeFit> fit;  // none: too little timed (the fewest pieces)
    std::int64_t budget = 0;     // the budget it cuts with
    double error = -1;           // the fit's largest error relative to a timed piece
    // Its compute per step over the next steps' shares as the fit predicts it, cut under the
    // budget and under half of it (-1: half would not hold the longest document).
    double step_seconds = -1, half_step_seconds = -1;
    std::int64_t steps = 0;  // the steps those are averaged over
  };
  std::vector<Rank> ranks;
};

}  // namespace autoaccum::train
