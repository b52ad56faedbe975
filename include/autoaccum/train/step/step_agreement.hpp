// Step agreement: from the reduced control values to the step's outcome, the same on every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autoaccum/comm/exact_slots.hpp"
#include "autoaccum/train/sizing/attempt_outcome.hpp"
#include "autoaccum/train/sizing/memory_model.hpp"

namespace autoaccum::train {

// The control region of the step's all-reduce: what each rank contributes besides gradients.
// Every slot is summed over the ranks, so a per-rank value has a slot (or comm::kExactSlots) per
// rank that only that rank writes.
struct ControlLayout {
  int world = 1;
  // Slots with one float per rank, then slots of comm::kExactSlots floats per rank; fields in
  // this order.
  enum class Float : int { kOom, kPhase, kComputeSeconds, kPieces, kCount };
  enum class Exact : int {
    kPeakBytes,
    kLoss,
    kWeight,
    kShapeUnits,
    kShapeSquare,
    kBaseBytes,
    kTokens,
    kPaddedTokens,
    kStop,  // rank 0's slot only: any rank's stop signal
    kCount
  };
  std::size_t oom(int rank) const { return index(Float::kOom, rank); }      // 1: it ran out
  std::size_t phase(int rank) const { return index(Float::kPhase, rank); }  // where (AttemptPhase)
  // Seconds the rank spent computing its part of the attempt (before the collective): the
  // speeds --balance throughput shares the batch by.
  std::size_t compute_seconds(int rank) const { return index(Float::kComputeSeconds, rank); }
  // The micro-batches its plan cut the rank's share into (documents: so that no rank computes
  // another's plan to log it).
  std::size_t pieces(int rank) const { return index(Float::kPieces, rank); }
  // Exact values: its peak memory in the attempt in bytes, its summed loss and the count of what
  // that loss counted (rows, tokens).
  std::size_t peak_bytes(int rank) const { return exact(Exact::kPeakBytes, rank); }
  std::size_t loss(int rank) const { return exact(Exact::kLoss, rank); }
  std::size_t weight(int rank) const { return exact(Exact::kWeight, rank); }
  // The micro-batch the peak belongs to (the one with the highest peak, or the one that ran out):
  // rows or padded tokens, and rows x width^2 for documents (train/memory_model.hpp).
  std::size_t shape_units(int rank) const { return exact(Exact::kShapeUnits, rank); }
  std::size_t shape_square(int rank) const { return exact(Exact::kShapeSquare, rank); }
  // Its live bytes when the attempt began: the state it holds whatever the micro-batch.
  std::size_t base_bytes(int rank) const { return exact(Exact::kBaseBytes, rank); }
  // Documents: the real and the padded tokens of the rank's plan.
  std::size_t tokens(int rank) const { return exact(Exact::kTokens, rank); }
  std::size_t padded_tokens(int rank) const { return exact(Exact::kPaddedTokens, rank); }
  std::size_t stop() const { return exact(Exact::kStop, 0); }  // signals
  // Ranks that left micro-batches undone because a stop signal came between two of them.
  std::size_t abandoned() const { return stop() + 1; }
  std::int64_t count() const { return static_cast<std::int64_t>(abandoned()) + 1; }

 private:
  std::size_t index(Float field, int rank) const {
    return static_cast<std::size_t>(static_cast<int>(field) * world + rank);
  }
  std::size_t exact(Exact field, int rank) const {
    return index(Float::kCount, 0) +
           comm::kExactSlots * static_cast<std::size_t>(static_cast<int>(field) * world + rank);
  }
};

// What one rank reports at the end of an attempt.
struct RankReport {
  bool out_of_memory = false;
  AttemptPhase phase = AttemptPhase::kNone;
  std::int64_t peak_bytes = 0;
  bool stop_requested = false;
  bool abandoned = false;  // stopped between micro-batches: the step's gradient is incomplete
  double compute_seconds = 0;
  MicroBatchShape peak_shape{};  // the micro-batch of the peak, or the one that ran out
  std::int64_t base_bytes = 0;   // live bytes when the attempt began
  // The attempt's plan: micro-batches, and for documents real and padded tokens.
  std::int64_t pieces = 0, tokens = 0, padded_tokens = 0;
};
// Writes `report` into this rank's slots of a zeroed host control array. The loss sum and its
// weight are not in it: the trainer writes their exact pieces into the loss and weight slots
// on the device, without a host synchronisation.
void write_report(const ControlLayout& layout, int rank, const RankReport& report, float* control);

// An attempt's agreed outcome, with the loss the ranks computed.
struct StepOutcome : AttemptOutcome {
  double loss_sum = 0;  // the loss summed over everything the ranks counted
  double weight = 0;    // how many items (rows, tokens, values) that was
  double loss = 0;      // the global batch's mean loss: loss_sum / weight (0 when nothing counted)
};
// Pure: every rank calls it on the same reduced array and so takes the same decision.
StepOutcome agree_on_step(const ControlLayout& layout, const float* reduced);

// Whether the optimizer may step: the reduced loss and a reduction of the reduced gradients
// (their sum or norm: NaN or Inf when any element is) are finite.
bool step_is_finite(double loss, double gradient_reduction) noexcept;

}  // namespace autoaccum::train
