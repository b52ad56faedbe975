// What checksums cost a checkpoint: writing (with fsync and renames, as training writes one) and
// reading it back whole (as --resume does), with and without them, in alternation.
//   build/tests/bench/bench_checkpoint FOLDER [repetitions]
// The checkpoint is the checkpoint benchmark's (docs/benchmarks.md): an MLP 784-4096-4096-4096-10
// in float32 (36.8M parameters) and SGD momentum's state of the same size, streamed as training
// streams it, 281 MiB in all.
// Prints one line per repetition and mode, then the medians and their ratios.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autoaccum/io/checkpoint.hpp"

#include "bench_timing.hpp"

using autoaccum::bench::median;
using autoaccum::bench::now;
namespace io = autoaccum::io;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_checkpoint FOLDER [repetitions]\n");
    return 1;
  }
  const std::string folder = argv[1];
  const int repetitions = argc > 2 ? std::atoi(argv[2]) : 5;
  torch::manual_seed(0);
  io::Checkpoint c;
  c.step = 2;
  std::int64_t values = 0;
  const std::vector<std::int64_t> widths = {784, 4096, 4096, 4096, 10};
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    const std::string layer = std::to_string(2 * i + 1);
    c.params.emplace_back(layer + ".weight", torch::randn({widths[i + 1], widths[i]}));
    c.params.emplace_back(layer + ".bias", torch::randn({widths[i + 1]}));
    values += widths[i + 1] * (widths[i] + 1);
  }
  // The momentum buffers as training writes them: streamed from LibTorch's serializer, a record
  // per tensor (here its bytes, in the parameters' sizes).
  std::string momentum(static_cast<std::size_t>(values * 4), '\0');
  for (std::size_t i = 0; i < momentum.size(); i += 4096)
    momentum[i] = static_cast<char>(i / 4096);
  c.stream_optimizer = [&](const io::ByteSink& sink) {
    std::size_t at = 0;
    for (const auto& [name, tensor] : c.params) {
      const auto bytes = static_cast<std::size_t>(tensor.nbytes());
      if (sink(momentum.data() + at, bytes) != bytes) return;
      at += bytes;
    }
  };
  c.generator_states = {std::string(5064, 'r')};

  const std::string path = folder + "/bench-checkpoint.h5";
  struct Mode {
    const char* name;
    io::Checksums checksums;
    std::vector<double> write, read;
  };
  std::vector<Mode> modes = {{"without", io::Checksums::kOff, {}, {}},
                             {"with", io::Checksums::kOn, {}, {}}};
  std::int64_t bytes = 0;
  for (int rep = 0; rep < repetitions; ++rep) {
    for (auto& mode : modes) {
      double start = now();
      bytes = io::write_checkpoint(path, c, 1, mode.checksums);
      mode.write.push_back(now() - start);
      start = now();
      const io::Checkpoint back = io::read_checkpoint(path, mode.checksums);
      mode.read.push_back(now() - start);
      if (back.params.size() != c.params.size() || back.optimizer != momentum ||
          back.verified != (mode.checksums == io::Checksums::kOn)) {
        std::fprintf(stderr, "bench_checkpoint: the checkpoint read back differs\n");
        return 1;
      }
      std::printf("rep %d %s checksums: write %.3f s (%.0f MiB/s), read %.3f s\n", rep + 1,
                  mode.name, mode.write.back(), bytes / mode.write.back() / (1 << 20),
                  mode.read.back());
    }
  }
  std::remove(path.c_str());
  const double write_without = median(modes[0].write), write_with = median(modes[1].write);
  const double read_without = median(modes[0].read), read_with = median(modes[1].read);
  std::printf("checkpoint bytes = %lld\n", static_cast<long long>(bytes));
  std::printf("write seconds without = %.4f, with = %.4f\n", write_without, write_with);
  std::printf("read seconds without = %.4f, with = %.4f\n", read_without, read_with);
  std::printf("write rate with / without = %.3f\n", write_without / write_with);
  std::printf("read time with / without = %.3f\n", read_with / read_without);
  return 0;
}
