// TimeFit: what a micro-batch of documents takes to compute on a rank, fitted from timed
// micro-batches, so that documents can be cut by predicted time (--micro-batch-cost auto;
// docs/design.md, "Cutting documents by predicted time").
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autoaccum/data/micro_batch_plan.hpp"
#include "autoaccum/train/sizing/memory_model.hpp"

namespace autoaccum::train {

// The models' view of a micro-batch of the plan (data/micro_batch_plan.hpp): rows, or padded
// tokens and rows x width^2.
MicroBatchShape piece_shape(const data::MicroBatchPiece& piece);

// seconds = fixed + per_unit x padded tokens + per_square x rows x width^2, every coefficient
// non-negative and per_unit positive: a micro-batch's own cost (calls, small products, the loss),
// each padded token's (the linear layers), and attention's scores, which grow with the width.
// The shape is the memory model's (MicroBatchShape): square = padded tokens x width.
struct TimeFit {
  double fixed = 0;
  double per_unit = 0;
  double per_square = 0;
  double predict(const MicroBatchShape& shape) const noexcept {
    return fixed + per_unit * shape.units + per_square * shape.square;
  }
  // The same cost in padded tokens' worth of time, as the planner weighs pieces: fixed / per_unit
  // per micro-batch, and each padded token weighed 1 + (per_square / per_unit) x its width.
  data::PieceCost piece_cost() const noexcept {
    return data::PieceCost{fixed / per_unit, per_square / per_unit};
  }
  // "4.5 ms + 23.0 us/token + 0.140 us/token x width"
  std::string describe() const;
};

// The fit to (shape, seconds) pairs that errs least relative to each time (a micro-batch of 30
// tokens counts as much as one of 3000), over non-negative coefficients: the exact least squares
// of each set of coefficients that holds per_unit, the best whose coefficients are all
// non-negative. Nothing without two different shapes or a positive time per token. Pure and
// deterministic: every rank fits every rank's timings alike.
std::optional<TimeFit> fit_time(const std::vector<std::pair<MicroBatchShape, double>>& timed);

}  // namespace autoaccum::train
