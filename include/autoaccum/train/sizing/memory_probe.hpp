// The memory probe (--micro-batch-search predict): real micro-batches measured before the first
// step, so that every rank starts at the largest size its memory model predicts to fit.
//
// A state machine the step drives: next(r) says what rank r attempts next; the step runs that
// attempt on every rank (one micro-batch of each rank's share of the first batch, rolled back) and
// hands the agreed outcome to take(). Every decision comes from agreed outcomes, so every rank
// holds the same probe, with no collective besides each attempt's own.
//
// Per rank: a small size first, then one twice its size or more (half of what the first one's
// bytes per unit say would fill the limit). A size that runs out halves the first; a second size
// that does not fit bounds the prediction and the probe takes a point below the first instead.
// Documents under --token-cost memory take a last point: the largest budget that fitted, spent on
// the share's shorter documents (data::narrow_piece), so that the model tells a wide token's cost
// from a narrow one's (data::WidthCost).
#pragma once

#include <cstdint>
#include <vector>

#include "autoaccum/train/sizing/attempt_outcome.hpp"

namespace autoaccum::train {

// Which micro-batch of an attempt's plan a probe runs (it always rolls back): none (a real
// attempt, every micro-batch), the first (rows, or documents padded to the data's longest width),
// documents at a narrow width (data::narrow_piece; nothing when the share has none), or one short
// document alone, kept out of the memory model (data::short_piece).
enum class ProbePiece { kNone, kFirstPiece, kNarrowPiece, kShortPiece };

class MemoryProbe {
 public:
  struct Setup {
    int world = 1;
    bool documents = false;            // sizes are token budgets
    std::int64_t low = 1;              // the smallest size it tries
    std::int64_t size_cap = 1;         // the largest size there is (a rank's whole share)
    bool narrow_point = false;         // documents under --token-cost memory
    std::vector<std::int64_t> limits;  // each rank's memory limit in bytes (0: none)
  };
  explicit MemoryProbe(Setup setup);

  bool done() const;
  struct Attempt {
    std::int64_t size = 0;  // 0: nothing (this rank is done while others probe)
    ProbePiece piece = ProbePiece::kFirstPiece;
  };
  Attempt next(int rank) const;
  // The agreed outcome of the attempt next() asked for: every rank's stage moves on.
  void take(const AttemptOutcome& outcome);

  // Ranks whose smallest size ran out: nothing fits there, and halving cannot help.
  const std::vector<int>& nothing_fits() const { return nothing_fits_; }
  std::int64_t attempts() const { return attempts_; }
  std::int64_t low() const { return setup_.low; }
  // Rank r's largest size that fitted and smallest that ran out (0: none).
  std::int64_t fitted(int rank) const { return ranks_.at(static_cast<std::size_t>(rank)).fitted; }
  std::int64_t failed(int rank) const { return ranks_.at(static_cast<std::size_t>(rank)).failed; }

 private:
  enum class Stage {
    kSmall,       // the first size, untried
    kLarge,       // the second, at least twice the first, untried
    kBelowSmall,  // the first was near the limit or the second ran out: half the first
    kNarrow,      // documents' narrow point, untried (after the others)
    kDone
  };
  struct Rank {
    Stage stage = Stage::kSmall;
    std::int64_t small = 0, large = 0;
    std::int64_t failed = 0;  // the smallest probe size that ran out
    std::int64_t fitted = 0;  // the largest probe size that fitted
    int sizes_fitted = 0;     // how many probe sizes fitted
  };
  std::int64_t size_of(const Rank& p) const;
  void sizes_done(Rank& p) const;
  void after_small(int rank, Rank& p, const AttemptOutcome& outcome, bool ran_out);

  Setup setup_;
  std::vector<Rank> ranks_;
  std::vector<int> nothing_fits_;
  std::int64_t attempts_ = 0;
};

}  // namespace autoaccum::train
