// Step agreement: reading the reduced control slots.
#include "autoaccum/train/step/step_agreement.hpp"

#include <cmath>
#include <sstream>

namespace autoaccum::train {

void write_report(const ControlLayout& layout, int rank, const RankReport& report, float* control) {
  control[layout.oom(rank)] = report.out_of_memory ? 1.0f : 0.0f;
  control[layout.phase(rank)] = static_cast<float>(report.phase);
  control[layout.compute_seconds(rank)] = static_cast<float>(report.compute_seconds);
  comm::write_exact(static_cast<double>(report.peak_bytes), control + layout.peak_bytes(rank));
  comm::write_exact(report.peak_shape.units, control + layout.shape_units(rank));
  comm::write_exact(report.peak_shape.square, control + layout.shape_square(rank));
  comm::write_exact(static_cast<double>(report.base_bytes), control + layout.base_bytes(rank));
  control[layout.pieces(rank)] = static_cast<float>(report.pieces);
  comm::write_exact(static_cast<double>(report.tokens), control + layout.tokens(rank));
  comm::write_exact(static_cast<double>(report.padded_tokens),
                    control + layout.padded_tokens(rank));
  control[layout.stop()] = report.stop_requested ? 1.0f : 0.0f;
  control[layout.abandoned()] = report.abandoned ? 1.0f : 0.0f;
}

StepOutcome agree_on_step(const ControlLayout& layout, const float* reduced) {
  StepOutcome outcome;
  for (int r = 0; r < layout.world; ++r) {
    if (reduced[layout.oom(r)] > 0.5f) outcome.out_of_memory.push_back(r);
    outcome.peak_bytes.push_back(
        static_cast<std::int64_t>(comm::read_exact(reduced + layout.peak_bytes(r))));
    outcome.peak_shapes.push_back(
        MicroBatchShape{comm::read_exact(reduced + layout.shape_units(r)),
                        comm::read_exact(reduced + layout.shape_square(r))});
    outcome.base_bytes.push_back(
        static_cast<std::int64_t>(comm::read_exact(reduced + layout.base_bytes(r))));
    outcome.phases.push_back(
        static_cast<AttemptPhase>(static_cast<int>(reduced[layout.phase(r)] + 0.5f)));
    outcome.compute_seconds.push_back(static_cast<double>(reduced[layout.compute_seconds(r)]));
    outcome.pieces.push_back(std::llround(reduced[layout.pieces(r)]));
    outcome.tokens.push_back(std::llround(comm::read_exact(reduced + layout.tokens(r))));
    outcome.padded_tokens.push_back(
        std::llround(comm::read_exact(reduced + layout.padded_tokens(r))));
    // In rank order, in double: the same sum on every rank, exact for counts below 2^53.
    outcome.loss_sum += comm::read_exact(reduced + layout.loss(r));
    outcome.weight += comm::read_exact(reduced + layout.weight(r));
  }
  outcome.stop = reduced[layout.stop()] > 0.5f;
  outcome.abandoned = reduced[layout.abandoned()] > 0.5f;
  outcome.loss = outcome.weight > 0 ? outcome.loss_sum / outcome.weight : 0.0;
  return outcome;
}

bool step_is_finite(double loss, double gradient_reduction) noexcept {
  return std::isfinite(loss) && std::isfinite(gradient_reduction);
}

}  // namespace autoaccum::train
