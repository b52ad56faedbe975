// Every rank's memory limit, known on every rank: what --memory-limit gives (one size for every
// rank, or a list whose item i mod n is rank i's) and, on a GPU, the device's memory where none
// is given.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace autoaccum::comm {
class Communicator;
}

namespace autoaccum::train {

class MemoryLimits {
 public:
  MemoryLimits() = default;
  MemoryLimits(std::int64_t limit, std::vector<std::int64_t> list);

  // The option's limit for `rank` (0: none).
  std::int64_t given(int rank) const;
  // Collective: every rank's limit, `mine` being this rank's (its option's, or its device's).
  void gather(comm::Communicator& comm, std::int64_t mine);
  std::int64_t of(int rank) const;  // gathered (0: none)
  const std::vector<std::int64_t>& all() const { return gathered_; }
  bool known() const;  // some rank has a limit to predict against

  // The option as given: "none", "96.0 MiB", or a list: "8.0 MiB, 16.0 MiB (rank i: item i mod 2)".
  std::string option_text() const;
  // For a message about `ranks`: "16.0 MiB per rank" (or "no --memory-limit"), or, given a list,
  // the limits of those ranks ("8.0 MiB on rank 1").
  std::string text(const std::vector<int>& ranks) const;

 private:
  std::int64_t limit_ = 0;
  std::vector<std::int64_t> list_;
  std::vector<std::int64_t> gathered_;
};

}  // namespace autoaccum::train
