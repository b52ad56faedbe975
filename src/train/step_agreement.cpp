// Step agreement: reading the reduced control slots.
#include "autoaccum/train/step_agreement.hpp"

#include <cmath>
#include <sstream>

namespace autoaccum::train {

void write_report(const ControlLayout& layout, int rank, const RankReport& report, float* control) {
  control[layout.oom(rank)] = report.out_of_memory ? 1.0f : 0.0f;
  control[layout.peak_kib(rank)] = static_cast<float>(report.peak_bytes / 1024);
  control[layout.stop()] = report.stop_requested ? 1.0f : 0.0f;
}

StepOutcome agree_on_step(const ControlLayout& layout, const float* reduced) {
  StepOutcome outcome;
  for (int r = 0; r < layout.world; ++r) {
    if (reduced[layout.oom(r)] > 0.5f) outcome.out_of_memory.push_back(r);
    outcome.peak_bytes.push_back(static_cast<std::int64_t>(reduced[layout.peak_kib(r)]) * 1024);
  }
  outcome.stop = reduced[layout.stop()] > 0.5f;
  outcome.loss = reduced[layout.loss()];
  return outcome;
}

std::string StepOutcome::ranks_text() const {
  std::ostringstream text;
  text << (out_of_memory.size() > 1 ? "ranks " : "rank ");
  for (std::size_t i = 0; i < out_of_memory.size(); ++i)
    text << (i ? ", " : "") << out_of_memory[i];
  return text.str();
}

bool step_is_finite(double loss, double gradient_reduction) noexcept {
  return std::isfinite(loss) && std::isfinite(gradient_reduction);
}

}  // namespace autoaccum::train
