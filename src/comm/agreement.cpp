// agree_on_failure: one all-reduce in the common case, then broadcasts of the failure.
#include "autoaccum/comm/agreement.hpp"

#include <cstdint>

namespace autoaccum::comm {

std::optional<RankFailure> agree_on_failure(Communicator& comm, const std::string& local_failure,
                                            int exit_code) {
  const bool failed = !local_failure.empty();
  const std::int64_t lowest = comm.allreduce_min(failed ? comm.rank() : comm.size());
  if (lowest == comm.size()) return std::nullopt;
  const int origin = static_cast<int>(lowest);
  const std::int64_t failures = comm.allreduce_sum(failed ? 1 : 0);
  std::string message = comm.rank() == origin ? local_failure : std::string();
  comm.broadcast(message, origin);
  std::int64_t code = exit_code;
  comm.broadcast(&code, sizeof code, origin);
  return RankFailure{origin, message, static_cast<int>(code), static_cast<int>(failures)};
}

void throw_collective(const Communicator& comm, const RankFailure& failure) {
  std::string message = failure.message;
  const std::string who = "rank " + std::to_string(failure.rank) + ": ";
  if (failure.ranks_failed < comm.size()) {
    if (message.compare(0, who.size(), who) != 0) message = who + message;
    if (failure.ranks_failed > 1) {
      message += " (and " + std::to_string(failure.ranks_failed - 1) + " other rank(s))";
    }
  }
  throw CollectiveError(message, static_cast<ExitCode>(failure.exit_code), failure.rank);
}

}  // namespace autoaccum::comm
