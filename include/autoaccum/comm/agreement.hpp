// Agreement on a failure: every rank learns, through collectives, that some rank failed.
#pragma once

#include <exception>
#include <optional>
#include <string>

#include "autoaccum/comm/communicator.hpp"
#include "autoaccum/core/error.hpp"

namespace autoaccum::comm {

struct RankFailure {
  int rank;             // the lowest rank that failed
  std::string message;  // its message
  int exit_code;        // its exit code
  int ranks_failed;     // how many ranks failed
};

// Collective: every rank passes its own failure message (empty when it succeeded) and the exit
// code it implies. Returns, on every rank, the failure of the lowest failing rank, or nothing when
// all succeeded. Costs one integer all-reduce when nothing failed.
std::optional<RankFailure> agree_on_failure(Communicator& comm, const std::string& local_failure,
                                            int exit_code = 1);

// Throws the agreed failure as a CollectiveError on every rank. The message names the failing
// rank unless every rank failed (then they all saw the same problem) or it begins with it.
[[noreturn]] void throw_collective(const Communicator& comm, const RankFailure& failure);

// Runs `fn` on every rank. If it throws on any rank, every rank throws a CollectiveError with the
// message and exit code of the lowest failing rank, so all ranks leave together and the
// message is printed once. `fn` must not itself enter a collective that could be left unmatched.
template <class Fn>
void collectively(Communicator& comm, Fn&& fn) {
  std::string failure;
  int code = 0;
  try {
    fn();
  } catch (const Error& e) {
    failure = e.what();
    code = static_cast<int>(e.exit_code());
  } catch (const std::exception& e) {
    failure = e.what();
    code = static_cast<int>(ExitCode::kInternal);
  }
  if (failure.empty() && code != 0) failure = "unknown error";
  if (auto agreed = agree_on_failure(comm, failure, code)) throw_collective(comm, *agreed);
}

}  // namespace autoaccum::comm
