// What the ranks measured in one attempt at a batch, the same on every rank (the step agrees on it
// from its reduced control table, step/step_agreement.hpp): who ran out of memory and where, each
// rank's peak and its shape, its compute time and its plan. Sizing learns from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autoaccum/train/sizing/memory_model.hpp"

namespace autoaccum::train {

// Where in an attempt a rank was when memory ran out.
// kRefused: not out of memory, but the model raised an error on a micro-batch smaller than one
// this rank tried before an out-of-memory lowered it (BatchNorm on one row): the run ends there.
enum class AttemptPhase : int {
  kNone = 0,
  kForward = 1,
  kLoss = 2,
  kBackward = 3,
  kBuffers = 4,
  kRefused = 5
};
const char* phase_name(AttemptPhase phase) noexcept;  // "forward", "backward", ...

std::string ranks_text(const std::vector<int>& ranks);  // "rank 1" or "ranks 0, 2"

struct AttemptOutcome {
  std::vector<int> out_of_memory;            // ranks that ran out of memory, ascending
  std::vector<std::int64_t> peak_bytes;      // per rank, this attempt
  std::vector<MicroBatchShape> peak_shapes;  // per rank: the micro-batch of its peak (or OOM)
  std::vector<std::int64_t> base_bytes;      // per rank: live bytes when the attempt began
  std::vector<AttemptPhase> phases;          // per rank: where it ran out (kNone: it did not)
  std::vector<double> compute_seconds;       // per rank: its time computing, before the collective
  // Per rank, the attempt's plan: micro-batches, and for documents real and padded tokens.
  std::vector<std::int64_t> pieces, tokens, padded_tokens;
  bool stop = false;       // some rank received a stop signal
  bool abandoned = false;  // some rank stopped between micro-batches: the step is not taken
  bool succeeded() const noexcept { return out_of_memory.empty() && !abandoned; }
  // Ranks whose model refused a smaller micro-batch (phase kRefused; also in out_of_memory, so
  // the attempt fails like one that ran out).
  std::vector<int> refused() const;
  std::string ranks_text() const { return train::ranks_text(out_of_memory); }
  // " in backward" when every rank that ran out was in the same phase, else " (rank 0 in
  // forward, rank 1 in backward)".
  std::string phases_text() const;
};
}  // namespace autoaccum::train
