// LocalCommunicator: the launcher's rank from the environment, collectives over one process.
#include "autoaccum/comm/local_communicator.hpp"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>

namespace autoaccum::comm {
namespace {

int number_from(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return *end == '\0' && value >= 0 && value < INT_MAX ? static_cast<int>(value) : fallback;
}

}  // namespace

LaunchedAs launched_as() {
  // Open MPI's mpirun, MPICH's hydra (PMI), then Slurm's srun.
  const char* pairs[][2] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                            {"PMI_RANK", "PMI_SIZE"},
                            {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (const auto& pair : pairs) {
    const int rank = number_from(pair[0], -1);
    if (rank < 0) continue;
    const int size = number_from(pair[1], rank + 1);
    return {rank, size > rank ? size : rank + 1};
  }
  return {};
}

LocalCommunicator::LocalCommunicator() {
  const LaunchedAs me = launched_as();
  rank_ = me.rank;
  size_ = me.size;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) std::strcpy(name, "?");
  hosts_.assign(1, name);
}

void LocalCommunicator::allgather(const void* send, std::size_t bytes, void* receive) {
  // Only this process's block: no other process's values reach it.
  std::memcpy(static_cast<char*>(receive) + static_cast<std::size_t>(rank_) * bytes, send, bytes);
}

}  // namespace autoaccum::comm
