// The gradient collective against a raw MPI_Allreduce loop over the same bytes: autoaccum's
// MpiCommunicator::allreduce_sum (what the trainer calls once per attempt) and MPI_Allreduce on
// MPI_COMM_WORLD, in alternating blocks, medians. A third column times the same call under the
// collective watchdog (--collective-timeout: its thread running, the call armed); "ours" runs
// with the watchdog off.
//   mpirun -np 2 build/tests/bench/bench_allreduce [floats] [repetitions] [multiple|funneled]
// The third argument is the thread level MPI is initialised with (autoaccum asks for MULTIPLE so
// that the watchdog's thread may ask the other ranks where they are): compare two processes.
// Prints one JSON object on rank 0.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autoaccum/comm/mpi_communicator.hpp"
#include "autoaccum/comm/watchdog.hpp"

#include "bench_timing.hpp"

using autoaccum::bench::median;
using autoaccum::bench::now;

int main(int argc, char** argv) {
  const bool funneled = argc > 3 && std::string(argv[3]) == "funneled";
  int provided = 0;
  MPI_Init_thread(&argc, &argv, funneled ? MPI_THREAD_FUNNELED : MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // The MLP 784-512-512-10's gradients plus the trainer's 2 * world + 2 slots.
  const long n = argc > 1 ? std::atol(argv[1]) : 669706 + 2L * size + 2;
  const int repetitions = argc > 2 ? std::atoi(argv[2]) : 200;
  std::vector<float> a(static_cast<std::size_t>(n), 1.0f), b(a);
  std::vector<double> raw, ours, watched;
  std::vector<float> c(a);
  {
    autoaccum::comm::MpiCommunicator comm;
    autoaccum::comm::Watchdog& dog = autoaccum::comm::watchdog();
    // Blocks of 20 calls per column, the columns' order rotating from block to block (a call's
    // place in a sequence biases it by a few percent); the watchdog's thread is started or
    // stopped only between blocks, as it is once per run in training. One block of warm-up.
    constexpr int kBlock = 20;
    const int blocks = std::max(1, repetitions / kBlock);
    std::vector<double>* columns[3] = {&raw, &ours, &watched};
    for (int block = 0; block <= blocks; ++block) {
      for (int k = 0; k < 3; ++k) {
        const int column = (block + k) % 3;
        // The watched column runs under the default --collective-timeout; the others without.
        dog.configure(
            column == 2 ? std::chrono::milliseconds(600000) : std::chrono::milliseconds(0), rank);
        for (int i = 0; i < kBlock; ++i) {
          std::vector<float>& buffer = column == 0 ? a : column == 1 ? b : c;
          std::fill(buffer.begin(), buffer.end(), 1.0f);  // small values; same work each time
          MPI_Barrier(MPI_COMM_WORLD);
          const double t = now();
          if (column == 0)
            MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
          else
            comm.allreduce_sum(buffer.data(), static_cast<std::size_t>(n));
          const double seconds = now() - t;
          if (block > 0) columns[column]->push_back(seconds);
        }
      }
    }
    dog.configure(std::chrono::milliseconds(0), rank);
  }
  if (rank == 0) {
    const double bytes = static_cast<double>(n) * sizeof(float);
    std::printf(
        "{\"ranks\": %d, \"floats\": %ld, \"repetitions\": %d, \"raw_us\": %.1f, \"ours_us\": "
        "%.1f, \"watched_us\": %.1f, \"raw_gbps\": %.3f, \"ours_gbps\": %.3f, \"ratio\": %.3f, "
        "\"watchdog_ratio\": %.3f, \"thread_level\": \"%s\"}\n",
        size, n, repetitions, median(raw) * 1e6, median(ours) * 1e6, median(watched) * 1e6,
        bytes / median(raw) / 1e9, bytes / median(ours) / 1e9, median(raw) / median(ours),
        median(ours) / median(watched), provided == MPI_THREAD_MULTIPLE ? "multiple" : "funneled");
  }
  MPI_Finalize();
  return 0;
}
