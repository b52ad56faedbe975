// The time probe (documents, --micro-batch-cost auto): pieces of each rank's share timed before
// the first step, so that a TimeFit can tell what a micro-batch takes to compute.
//
// A state machine the step drives, as the memory probe is (memory_probe.hpp): next_size() and
// next_piece() say what every rank attempts next (each rank a piece of its own share, rolled
// back); the step runs the attempt and hands the agreed outcome to take(). The timings travel in
// each attempt's own all-reduce, so every rank fits every rank's model alike and no collective
// is added. In order:
//   - the budget's piece padded to the data's longest width (data::widen_piece), once untimed
//     first (a graph's first call at a shape compiles and allocates);
//   - a quarter of the budget at that width: with the first, the cost per padded token there;
//   - the budget spent on the share's shorter documents (data::narrow_piece; none when its
//     documents are alike in length): what a narrow token costs against a wide one;
//   - one short document alone (data::short_piece): mostly a micro-batch's own cost.
// Each timed shape runs twice and keeps its faster time (a timing is never too fast, only
// delayed). A piece that runs out of memory is not timed (the step lowers the budget as a step's
// out-of-memory would).
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "autoaccum/train/sizing/attempt_outcome.hpp"
#include "autoaccum/train/sizing/memory_probe.hpp"

namespace autoaccum::train {

class TimeProbeSchedule {
 public:
  explicit TimeProbeSchedule(int world);
  bool done() const { return next_ >= order_.size(); }
  // What every rank attempts next: its piece, at its budget or a quarter of it (never below the
  // longest document, `floor`).
  ProbePiece next_piece() const { return order_.at(next_).piece; }
  std::int64_t next_size(std::int64_t budget, std::int64_t floor) const;
  // The agreed outcome of that attempt: every rank's time at its piece's shape, if it was timed.
  void take(const AttemptOutcome& outcome);
  std::int64_t attempts() const { return static_cast<std::int64_t>(next_); }
  // Rank r's shapes and the fastest time of each.
  std::vector<std::pair<MicroBatchShape, double>> timed(int rank) const;

 private:
  struct Piece {
    ProbePiece piece;
    bool quarter;  // a quarter of the budget
    bool timed;
  };
  std::vector<Piece> order_;
  std::size_t next_ = 0;
  // Per rank: each shape measured (units, square) and its fastest time.
  std::vector<std::map<std::pair<double, double>, double>> fastest_;
};

}  // namespace autoaccum::train
