// Slab reads against a plain sequential read of the same bytes, both from the page cache.
//   mpirun -np 2 build/tests/bench/bench_slab_read FILE [global_batch] [repetitions]
// Each rank reads its slab of every batch of one shuffled epoch through SlabReader (HDF5
// hyperslabs straight into tensor memory), then reads the same number of bytes, slab-sized,
// front to back with pread(2) from the dataset's offset. Prints slab / sequential bandwidth.
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autoaccum/data/batch_plan.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/memory/memory.hpp"

#include "bench_timing.hpp"

using autoaccum::bench::median;
using autoaccum::bench::now;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc < 2) {
    if (rank == 0)
      std::fprintf(stderr, "usage: bench_slab_read FILE [global_batch] [repetitions]\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const std::string path = argv[1];
  const std::int64_t batch = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int repetitions = argc > 3 ? std::atoi(argv[3]) : 3;

  autoaccum::memory::tune_malloc();  // as the trainer does: freed slabs stay mapped
  autoaccum::data::SlabReader reader({path}, {"x"}, "y", /*check_labels=*/false);
  const auto& schema = reader.schema();
  std::int64_t row_bytes = 4;
  for (auto d : schema.fields.front().row_shape)
    row_bytes *= d;
  autoaccum::data::BatchPlan plan(schema.rows, batch, size, autoaccum::data::Shuffle::kBatch, 1);

  // Where x starts in the file (contiguous layout), for the sequential baseline.
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t dataset = H5Dopen2(file, "x", H5P_DEFAULT);
  const haddr_t offset = H5Dget_offset(dataset);
  H5Dclose(dataset);
  H5Fclose(file);
  if (offset == HADDR_UNDEF) {
    if (rank == 0) std::fprintf(stderr, "x must have the contiguous layout\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const int fd = open(path.c_str(), O_RDONLY);
  const std::int64_t slab_rows = autoaccum::data::BatchPlan::rank_part(batch, size, rank).size();
  std::vector<char> buffer(static_cast<std::size_t>(slab_rows * row_bytes));

  std::vector<double> slab_seconds, plain_seconds;
  std::int64_t bytes = 0;
  for (int r = 0; r < repetitions + 1; ++r) {  // the first round warms the page cache
    MPI_Barrier(MPI_COMM_WORLD);
    double t = now();
    bytes = 0;
    for (std::int64_t s = 0; s < plan.batches_per_epoch(); ++s) {
      const auto rows = plan.rank_rows(r, s, rank);
      const auto b = reader.read(rows.begin, rows.end);
      bytes += b.get("x").nbytes();
    }
    const double slab = now() - t;
    MPI_Barrier(MPI_COMM_WORLD);
    t = now();
    std::int64_t done = 0;
    // This rank's share of the file, front to back, in slab-sized reads.
    const std::int64_t share_begin =
        static_cast<std::int64_t>(offset) +
        autoaccum::data::BatchPlan::rank_part(schema.rows, size, rank).begin * row_bytes;
    while (done < bytes) {
      const auto want = static_cast<std::size_t>(
          std::min<std::int64_t>(static_cast<std::int64_t>(buffer.size()), bytes - done));
      const ssize_t got = pread(fd, buffer.data(), want, share_begin + done);
      if (got <= 0) break;
      done += got;
    }
    const double plain = now() - t;
    if (r > 0) {
      slab_seconds.push_back(slab);
      plain_seconds.push_back(plain);
    }
  }
  close(fd);
  double slab = median(slab_seconds), plain = median(plain_seconds);
  double worst[2] = {slab, plain};
  MPI_Allreduce(MPI_IN_PLACE, worst, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    const double gb = static_cast<double>(bytes) * size / 1e9;
    std::printf(
        "%d ranks, %.2f GB per epoch of x, global batch %lld, %d repetitions (medians, slowest "
        "rank)\n",
        size, gb, static_cast<long long>(batch), repetitions);
    std::printf("slab reads (SlabReader, shuffled batches): %.3f s, %.2f GB/s\n", worst[0],
                gb / worst[0]);
    std::printf("plain sequential pread of the same bytes:  %.3f s, %.2f GB/s\n", worst[1],
                gb / worst[1]);
    std::printf("slab / sequential bandwidth = %.3f\n", worst[1] / worst[0]);
  }
  MPI_Finalize();
  return 0;
}
