// Step agreement: reading the reduced control slots.
#include "autoaccum/train/step/step_agreement.hpp"

#include <cmath>
#include <sstream>

namespace autoaccum::train {

void write_exact(double value, float* slots) noexcept {
  const float high = static_cast<float>(value);
  if (!std::isfinite(high)) {  // NaN, Inf, or beyond float's range: the high slot says so
    slots[0] = std::isnan(value) ? high : static_cast<float>(std::copysign(HUGE_VAL, value));
    slots[1] = slots[2] = 0.0f;
    return;
  }
  const double rest = value - static_cast<double>(high);  // exact in double
  const float middle = static_cast<float>(rest);
  slots[0] = high;
  slots[1] = middle;
  slots[2] = static_cast<float>(rest - static_cast<double>(middle));
}

double read_exact(const float* slots) noexcept {
  if (!std::isfinite(slots[0])) return static_cast<double>(slots[0]);
  return static_cast<double>(slots[0]) + static_cast<double>(slots[1]) +
         static_cast<double>(slots[2]);
}

void write_report(const ControlLayout& layout, int rank, const RankReport& report, float* control) {
  control[layout.oom(rank)] = report.out_of_memory ? 1.0f : 0.0f;
  control[layout.phase(rank)] = static_cast<float>(report.phase);
  control[layout.compute_seconds(rank)] = static_cast<float>(report.compute_seconds);
  write_exact(static_cast<double>(report.peak_bytes), control + layout.peak_bytes(rank));
  write_exact(report.peak_shape.units, control + layout.shape_units(rank));
  write_exact(report.peak_shape.square, control + layout.shape_square(rank));
  write_exact(static_cast<double>(report.base_bytes), control + layout.base_bytes(rank));
  control[layout.pieces(rank)] = static_cast<float>(report.pieces);
  write_exact(static_cast<double>(report.tokens), control + layout.tokens(rank));
  write_exact(static_cast<double>(report.padded_tokens), control + layout.padded_tokens(rank));
  control[layout.stop()] = report.stop_requested ? 1.0f : 0.0f;
  control[layout.abandoned()] = report.abandoned ? 1.0f : 0.0f;
}

const char* phase_name(AttemptPhase phase) noexcept {
  switch (phase) {
    case AttemptPhase::kForward:
      return "forward";
    case AttemptPhase::kLoss:
      return "the loss";
    case AttemptPhase::kBackward:
      return "backward";
    case AttemptPhase::kBuffers:
      return "the buffer update";
    case AttemptPhase::kRefused:
      return "a model error";
    default:
      return "an unknown place";
  }
}

std::vector<int> StepOutcome::refused() const {
  std::vector<int> ranks;
  for (int r : out_of_memory)
    if (phases.at(static_cast<std::size_t>(r)) == AttemptPhase::kRefused) ranks.push_back(r);
  return ranks;
}

StepOutcome agree_on_step(const ControlLayout& layout, const float* reduced) {
  StepOutcome outcome;
  for (int r = 0; r < layout.world; ++r) {
    if (reduced[layout.oom(r)] > 0.5f) outcome.out_of_memory.push_back(r);
    outcome.peak_bytes.push_back(
        static_cast<std::int64_t>(read_exact(reduced + layout.peak_bytes(r))));
    outcome.peak_shapes.push_back(MicroBatchShape{read_exact(reduced + layout.shape_units(r)),
                                                  read_exact(reduced + layout.shape_square(r))});
    outcome.base_bytes.push_back(
        static_cast<std::int64_t>(read_exact(reduced + layout.base_bytes(r))));
    outcome.phases.push_back(
        static_cast<AttemptPhase>(static_cast<int>(reduced[layout.phase(r)] + 0.5f)));
    outcome.compute_seconds.push_back(static_cast<double>(reduced[layout.compute_seconds(r)]));
    outcome.pieces.push_back(std::llround(reduced[layout.pieces(r)]));
    outcome.tokens.push_back(std::llround(read_exact(reduced + layout.tokens(r))));
    outcome.padded_tokens.push_back(std::llround(read_exact(reduced + layout.padded_tokens(r))));
    // In rank order, in double: the same sum on every rank, exact for counts below 2^53.
    outcome.loss_sum += read_exact(reduced + layout.loss(r));
    outcome.weight += read_exact(reduced + layout.weight(r));
  }
  outcome.stop = reduced[layout.stop()] > 0.5f;
  outcome.abandoned = reduced[layout.abandoned()] > 0.5f;
  outcome.loss = outcome.weight > 0 ? outcome.loss_sum / outcome.weight : 0.0;
  return outcome;
}

std::string StepOutcome::ranks_text() const {
  std::ostringstream text;
  text << (out_of_memory.size() > 1 ? "ranks " : "rank ");
  for (std::size_t i = 0; i < out_of_memory.size(); ++i)
    text << (i ? ", " : "") << out_of_memory[i];
  return text.str();
}

std::string StepOutcome::phases_text() const {
  if (out_of_memory.empty()) return "";
  const AttemptPhase first = phases.at(static_cast<std::size_t>(out_of_memory.front()));
  bool same = true;
  for (int r : out_of_memory)
    same = same && phases.at(static_cast<std::size_t>(r)) == first;
  if (same) return std::string(" in ") + phase_name(first);
  std::ostringstream text;
  text << " (";
  for (std::size_t i = 0; i < out_of_memory.size(); ++i) {
    const int r = out_of_memory[i];
    text << (i ? ", " : "") << "rank " << r << " in "
         << phase_name(phases.at(static_cast<std::size_t>(r)));
  }
  text << ")";
  return text.str();
}

bool step_is_finite(double loss, double gradient_reduction) noexcept {
  return std::isfinite(loss) && std::isfinite(gradient_reduction);
}

}  // namespace autoaccum::train
