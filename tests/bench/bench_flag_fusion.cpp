// Fused vs separate OOM flag: is carrying the step's flags inside the gradient all-reduce faster
// than a one-integer all-reduce right before it? Run under mpirun; prints the ratio.
//   mpirun -np 2 build/tests/bench/bench_flag_fusion [gradient floats] [repetitions]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_timing.hpp"

using autoaccum::bench::median;
using autoaccum::bench::now;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const long n = argc > 1 ? std::atol(argv[1]) : 669706;  // the MLP 784-512-512-10
  const int repetitions = argc > 2 ? std::atoi(argv[2]) : 200;
  const long slots = 2L * size + 2;
  std::vector<float> buffer(static_cast<std::size_t>(n + slots), 1.0f);
  std::vector<double> fused, separate;
  for (int r = 0; r < repetitions; ++r) {
    // Interleaved, so both see the same machine noise.
    MPI_Barrier(MPI_COMM_WORLD);
    double t = now();
    MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(n + slots), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    fused.push_back(now() - t);
    MPI_Barrier(MPI_COMM_WORLD);
    t = now();
    long long flag = 0;
    MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    separate.push_back(now() - t);
  }
  if (rank == 0) {
    const double a = median(fused), b = median(separate);
    std::printf("ranks %d, %ld gradient floats, %d repetitions\n", size, n, repetitions);
    std::printf("fused (gradients + %ld slots): median %.1f us\n", slots, a * 1e6);
    std::printf("separate (1 int + gradients):  median %.1f us\n", b * 1e6);
    std::printf("separate / fused = %.3f\n", b / a);
  }
  MPI_Finalize();
  return 0;
}
