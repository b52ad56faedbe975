// An attempt's agreed outcome, in words.
#include "autoaccum/train/sizing/attempt_outcome.hpp"

#include <sstream>

namespace autoaccum::train {

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

std::vector<int> AttemptOutcome::refused() const {
  std::vector<int> ranks;
  for (int r : out_of_memory)
    if (phases.at(static_cast<std::size_t>(r)) == AttemptPhase::kRefused) ranks.push_back(r);
  return ranks;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::ostringstream text;
  text << (ranks.size() > 1 ? "ranks " : "rank ");
  for (std::size_t i = 0; i < ranks.size(); ++i)
    text << (i ? ", " : "") << ranks[i];
  return text.str();
}

std::string AttemptOutcome::phases_text() const {
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

}  // namespace autoaccum::train
