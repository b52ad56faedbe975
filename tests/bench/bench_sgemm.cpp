// The single-core sgemm ceiling, measured on every rank at once (the ranks share the machine's
// memory bandwidth and caches, as in training). Each rank runs LibTorch's at::mm with one thread
// on several shapes; the rate reported for a shape is the slowest rank's best repetition.
//   mpirun -np 2 build/tests/bench/bench_sgemm [seconds per shape]
// Prints one JSON object on rank 0: {"shapes": [{"m":..,"k":..,"n":..,"gflops":..}], "peak": ..}
#include <ATen/ATen.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_timing.hpp"

namespace {

struct Shape {
  std::int64_t m, k, n;
};

}  // namespace

using autoaccum::bench::now;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const double budget = argc > 1 ? std::atof(argv[1]) : 0.5;
  at::set_num_threads(1);
  // The MLP 784-512-512-10's largest GEMMs at micro-batch 512 and 64, and large squares.
  const std::vector<Shape> shapes = {
      {512, 784, 512}, {64, 784, 512}, {512, 512, 512}, {1024, 1024, 1024}, {2048, 2048, 2048}};
  std::string json = "{\"shapes\": [";
  double peak = 0;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const Shape s = shapes[i];
    const at::Tensor a = at::rand({s.m, s.k}), b = at::rand({s.k, s.n});
    at::Tensor c = at::empty({s.m, s.n});
    at::mm_out(c, a, b);  // warm-up
    double best = 1e30;
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = now();
    int reps = 0;
    // Every rank runs the same number of repetitions: agree on stopping each round.
    for (int more = 1; more;) {
      const double t = now();
      at::mm_out(c, a, b);
      best = std::min(best, now() - t);
      ++reps;
      int go = (now() - start < budget || reps < 3) ? 1 : 0;
      MPI_Allreduce(&go, &more, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    }
    double rate = 2.0 * static_cast<double>(s.m * s.k * s.n) / best / 1e9, slowest = 0;
    MPI_Reduce(&rate, &slowest, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    peak = std::max(peak, slowest);
    char item[160];
    std::snprintf(item, sizeof item, "%s{\"m\": %lld, \"k\": %lld, \"n\": %lld, \"gflops\": %.2f}",
                  i ? ", " : "", static_cast<long long>(s.m), static_cast<long long>(s.k),
                  static_cast<long long>(s.n), slowest);
    json += item;
  }
  if (rank == 0) std::printf("%s], \"peak\": %.2f}\n", json.c_str(), peak);
  MPI_Finalize();
  return 0;
}
