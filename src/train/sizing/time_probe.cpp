// The time probe's attempts in order, and the fastest time of each shape per rank.
#include "autoaccum/train/sizing/time_probe.hpp"

#include <algorithm>
#include <iterator>

namespace autoaccum::train {

TimeProbeSchedule::TimeProbeSchedule(int world) : fastest_(static_cast<std::size_t>(world)) {
  const Piece warm{ProbePiece::kFirstPiece, false, false};
  const Piece pieces[] = {{ProbePiece::kFirstPiece, false, true},
                          {ProbePiece::kFirstPiece, true, true},
                          {ProbePiece::kNarrowPiece, false, true},
                          {ProbePiece::kShortPiece, false, true}};
  order_.push_back(warm);
  for (int round = 0; round < 2; ++round)
    order_.insert(order_.end(), std::begin(pieces), std::end(pieces));
}

std::int64_t TimeProbeSchedule::next_size(std::int64_t budget, std::int64_t floor) const {
  return order_.at(next_).quarter ? std::max(floor, budget / 4) : budget;
}

void TimeProbeSchedule::take(const AttemptOutcome& outcome) {
  const Piece& piece = order_.at(next_++);
  if (!piece.timed || !outcome.out_of_memory.empty()) return;
  for (std::size_t i = 0; i < fastest_.size(); ++i) {
    const MicroBatchShape shape = outcome.peak_shapes[i];
    const double seconds = outcome.compute_seconds[i];
    if (!(shape.units > 0) || !(seconds > 0)) continue;  // no such piece on this rank
    auto [it, added] = fastest_[i].try_emplace({shape.units, shape.square}, seconds);
    if (!added) it->second = std::min(it->second, seconds);
  }
}

std::vector<std::pair<MicroBatchShape, double>> TimeProbeSchedule::timed(int rank) const {
  std::vector<std::pair<MicroBatchShape, double>> shapes;
  for (const auto& [shape, seconds] : fastest_.at(static_cast<std::size_t>(rank)))
    shapes.push_back({MicroBatchShape{shape.first, shape.second}, seconds});
  return shapes;
}

}  // namespace autoaccum::train
