// The memory probe's stages, rank by rank, from agreed outcomes.
#include "autoaccum/train/sizing/memory_probe.hpp"

#include <algorithm>
#include <utility>

namespace autoaccum::train {

MemoryProbe::MemoryProbe(Setup setup)
    : setup_(std::move(setup)), ranks_(static_cast<std::size_t>(setup_.world)) {
  // The first size: small enough to fit in the usual case (rows: a sixteenth of the share;
  // documents: the longest document alone, the budget's floor).
  for (Rank& p : ranks_)
    p.small = setup_.documents ? setup_.low : std::max(setup_.low, setup_.size_cap / 16);
}

bool MemoryProbe::done() const {
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [](const Rank& p) { return p.stage == Stage::kDone; });
}

std::int64_t MemoryProbe::size_of(const Rank& p) const {
  switch (p.stage) {
    case Stage::kSmall:
      return p.small;
    case Stage::kLarge:
      return p.large;
    case Stage::kBelowSmall:
      return p.small / 2;
    case Stage::kNarrow:
      return p.fitted;
    case Stage::kDone:
      break;
  }
  return 0;
}

MemoryProbe::Attempt MemoryProbe::next(int rank) const {
  const Rank& p = ranks_.at(static_cast<std::size_t>(rank));
  return {size_of(p),
          p.stage == Stage::kNarrow ? ProbePiece::kNarrowPiece : ProbePiece::kFirstPiece};
}

// The sizes are measured: documents under --token-cost memory then take the narrow point, at the
// largest budget that fitted, once two budgets fitted (a slope per token at the longest width to
// tell the narrow point's from; one wide point and a narrow one fit nothing).
void MemoryProbe::sizes_done(Rank& p) const {
  p.stage = setup_.narrow_point && p.sizes_fitted >= 2 ? Stage::kNarrow : Stage::kDone;
}

void MemoryProbe::take(const AttemptOutcome& outcome) {
  ++attempts_;
  for (int r = 0; r < setup_.world; ++r) {
    Rank& p = ranks_[static_cast<std::size_t>(r)];
    const std::int64_t tried = size_of(p);
    const bool ran_out = std::find(outcome.out_of_memory.begin(), outcome.out_of_memory.end(), r) !=
                         outcome.out_of_memory.end();
    switch (p.stage) {
      case Stage::kDone:
        continue;
      case Stage::kNarrow:
        // A shape, not a size: the memory model has it (or its out-of-memory) either way.
        p.stage = Stage::kDone;
        continue;
      default:
        break;
    }
    if (ran_out) p.failed = p.failed > 0 ? std::min(p.failed, tried) : tried;
    if (!ran_out) {
      p.fitted = std::max(p.fitted, tried);
      ++p.sizes_fitted;
    }
    const bool below_small_fits = p.small / 2 >= setup_.low && p.small / 2 < p.small;
    if (p.stage == Stage::kSmall) {
      after_small(r, p, outcome, ran_out);
    } else if (p.stage == Stage::kLarge && ran_out && below_small_fits) {
      p.stage = Stage::kBelowSmall;  // a second point below the first: the larger did not fit
    } else {
      sizes_done(p);
    }
  }
}

// After the first size: halve it if it ran out; else choose the second size from its
// measurement.
void MemoryProbe::after_small(int rank, Rank& p, const AttemptOutcome& outcome, bool ran_out) {
  const auto i = static_cast<std::size_t>(rank);
  if (ran_out) {
    if (p.small <= setup_.low)
      nothing_fits_.push_back(rank);
    else
      p.small = std::max(setup_.low, p.small / 2);
    return;
  }
  // The second size: half of what the first one's bytes per unit (above the state the rank held
  // before it) say would fill the limit, so that the two points lie far apart and the second
  // still fits in the usual case. A share smaller than the size tried (the whole share measured)
  // or no limit on this rank: nothing more to learn, no narrow point either.
  const double measured = outcome.peak_shapes[i].units;
  const std::int64_t limit = setup_.limits[i];
  if ((!setup_.documents && measured < static_cast<double>(p.small)) || limit <= 0) {
    p.stage = Stage::kDone;
    return;
  }
  const double per_unit =
      measured > 0 ? static_cast<double>(outcome.peak_bytes[i] - outcome.base_bytes[i]) / measured
                   : 0.0;
  const double room = static_cast<double>(limit - outcome.base_bytes[i]);
  const auto half_of_fill =
      per_unit > 0 ? static_cast<std::int64_t>(0.5 * room / per_unit) : 2 * p.small;
  // At least twice the first: a second point close to the first says little (an attempt may hold
  // a large fixed cost beyond the state, such as gradients being accumulated: the first point
  // alone would count it per row), and for documents a smaller budget would not change the shape.
  // If it runs out, that bounds the model.
  p.large = std::min(setup_.size_cap, std::max(half_of_fill, 2 * p.small));
  if (p.large >= p.small + std::max<std::int64_t>(1, p.small / 2)) {
    p.stage = Stage::kLarge;
  } else if (p.small / 2 >= setup_.low && p.small / 2 < p.small) {
    p.stage = Stage::kBelowSmall;  // the first size is already near the limit: one below it
  } else {
    sizes_done(p);
  }
}

}  // namespace autoaccum::train
