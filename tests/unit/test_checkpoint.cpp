// Checkpoint files: every dataset verified against its checksum; the last N kept; a newest one
// that cannot be read or verified, for any reason, gives way to the newest older one that can.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "autoaccum/hdf5/hdf5.hpp"
#include "autoaccum/io/checkpoint.hpp"
#include "autoaccum/memory/memory.hpp"

namespace autoaccum::io {
namespace {

Checkpoint with_parameter(std::int64_t step, std::int64_t elements) {
  Checkpoint c;
  c.step = step;
  c.micro_batch = 8;
  c.params.emplace_back("w", torch::full({elements}, static_cast<float>(step)));
  return c;
}

TEST(Checkpoint, ANewestThatRunsOutOfMemoryWhileReadFallsBackToThePrevious) {
  const std::string path = "/tmp/autoaccum-unit-ckpt-" + std::to_string(::getpid()) + ".h5";
  write_checkpoint(path, with_parameter(3, 1000));     // becomes the previous one
  write_checkpoint(path, with_parameter(4, 4 << 20));  // 16 MiB of parameters
  ASSERT_EQ(read_checkpoint(path).step, 4) << "both files are whole";

  // A budget too small for the newest file's tensor (as a small --memory-limit would be):
  // LibTorch's allocation fails inside the read, which is not one of autoaccum's own errors.
  memory::install_cpu_budget(0);
  memory::install_cpu_budget(memory::cpu_live_bytes() + (1 << 20));
  std::optional<LoadedCheckpoint> loaded;
  EXPECT_NO_THROW(loaded = read_latest_checkpoint(path));
  memory::install_cpu_budget(0);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->path, older_checkpoint_path(path, 3));
  EXPECT_EQ(loaded->checkpoint.step, 3);
  EXPECT_EQ(loaded->checkpoint.params.at(0).second[999].item<float>(), 3.0f);
  ASSERT_EQ(loaded->skipped.size(), 1u);
  EXPECT_EQ(loaded->skipped[0].path, path);
  EXPECT_NE(loaded->skipped[0].why.find("memory limit"), std::string::npos)
      << loaded->skipped[0].why;
  std::remove(path.c_str());
  std::remove(older_checkpoint_path(path, 3).c_str());
}

TEST(Checkpoint, TensorsOfEveryKindAndAStreamedOptimizerRoundTrip) {
  // A bfloat16 tensor stored as float32 (18 MB: written in 8 MiB pieces of rows), a transposed
  // (not contiguous) one, a bool one, a scalar; optimizer bytes streamed in uneven pieces.
  const std::string path = "/tmp/autoaccum-unit-kinds-" + std::to_string(::getpid()) + ".h5";
  torch::manual_seed(1);
  const at::Tensor big = torch::randn({3000, 1500}).to(torch::kBFloat16);
  const at::Tensor transposed = torch::randn({40, 30}).t();
  const at::Tensor flags = torch::rand({17}) > 0.5;
  const at::Tensor scalar = torch::tensor(2.5, torch::kDouble);
  Checkpoint c;
  c.step = 7;
  c.params = {{"big", big}, {"transposed", transposed}, {"flags", flags}, {"scalar", scalar}};
  std::string bytes(300007, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<char>((i * 7919) % 251);
  int calls = 0;
  c.stream_optimizer = [&](const ByteSink& sink) {
    ++calls;
    std::size_t at = 0;
    for (std::size_t piece : {std::size_t{1}, std::size_t{100000}, std::size_t{200006}}) {
      ASSERT_EQ(sink(bytes.data() + at, piece), piece);
      at += piece;
    }
  };
  const std::int64_t written = write_checkpoint(path, c);
  EXPECT_EQ(calls, 2) << "measured, then written";
  EXPECT_GT(written, 3000 * 1500 * 4);
  const Checkpoint back = read_checkpoint(path);
  ASSERT_EQ(back.params.size(), 4u);
  EXPECT_TRUE(torch::equal(back.params[0].second, big.to(torch::kFloat)));
  EXPECT_TRUE(torch::equal(back.params[1].second, transposed));
  EXPECT_TRUE(torch::equal(back.params[2].second, flags.to(torch::kByte)));
  EXPECT_EQ(back.params[3].second.item<double>(), 2.5);
  EXPECT_EQ(back.optimizer, bytes);
  std::remove(path.c_str());
}

TEST(Checkpoint, ParametersLeftInTheFileAreVerifiedAndReadIntoAnyTensorInPieces) {
  // Parameters::kInFile: the float32 parameters stay in the file, verified; read_stored fills a
  // float32 host tensor straight, and any other (a double one here, in two 16 MiB pieces) through
  // host pieces; other types are read whole as before. A flipped bit is still found at once.
  const std::string path = "/tmp/autoaccum-unit-infile-" + std::to_string(::getpid()) + ".h5";
  torch::manual_seed(3);
  const at::Tensor big = torch::randn({3000, 1500});
  const at::Tensor flags = torch::rand({17}) > 0.5;
  Checkpoint c;
  c.step = 2;
  c.params = {{"big", big}, {"flags", flags}, {"scalar", torch::tensor(2.5, torch::kDouble)}};
  write_checkpoint(path, c);
  const Checkpoint back = read_checkpoint(path, Checksums::kOn, Parameters::kInFile);
  EXPECT_TRUE(back.verified);
  ASSERT_EQ(back.stored_params.size(), 1u);
  EXPECT_EQ(back.stored_params[0].name, "big");
  EXPECT_EQ(back.stored_params[0].shape, (std::vector<std::int64_t>{3000, 1500}));
  ASSERT_EQ(back.params.size(), 2u);  // read whole: not float32
  EXPECT_TRUE(torch::equal(back.params[0].second, flags.to(torch::kByte)));
  EXPECT_EQ(back.params[1].second.item<double>(), 2.5);
  const at::Tensor straight = torch::empty({3000 * 1500});
  read_stored(back.stored_params[0], 0, straight);
  EXPECT_TRUE(torch::equal(straight, big.reshape(-1)));
  const at::Tensor converted = torch::empty({3000 * 1500}, torch::kDouble);
  read_stored(back.stored_params[0], 0, converted);
  EXPECT_TRUE(torch::equal(converted, big.reshape(-1).to(torch::kDouble)));
  const at::Tensor part = torch::empty({2999}, torch::kDouble);  // from inside a row, across rows
  read_stored(back.stored_params[0], 1501, part);
  EXPECT_TRUE(torch::equal(part, big.reshape(-1).narrow(0, 1501, 2999).to(torch::kDouble)));

  std::int64_t offset = 0;
  {
    const auto file = hdf5::File::open(path);
    offset = *file.dataset("params/big").raw_offset(hdf5::DType::kFloat32);
  }
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const unsigned char byte = 0x5a;
  ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(offset + big.nbytes() - 5)), 1);
  ::close(fd);
  EXPECT_THROW(read_checkpoint(path, Checksums::kOn, Parameters::kInFile), CheckpointDamaged);
  std::remove(path.c_str());
}

TEST(Checkpoint, OptimizerStateStreamedInPiecesOfAnySizeReadsBackWholePerParameter) {
  // As a sharded run gives it: pieces that end inside rows and cross them, from two "owners".
  const std::string path = "/tmp/autoaccum-unit-streamed-" + std::to_string(::getpid()) + ".h5";
  torch::manual_seed(2);
  const at::Tensor w = torch::randn({300, 7}), v = torch::randn({11});
  Checkpoint c;
  c.step = 3;
  c.optimizer_kind = "adamw";
  c.optimizer_step = 3;
  const auto pieces = [](at::Tensor t, std::vector<std::int64_t> cuts) {
    return [t, cuts](const Checkpoint::PieceSink& sink) {
      const at::Tensor flat = t.reshape(-1);
      std::int64_t at = 0;
      for (const std::int64_t n : cuts) {
        sink(flat.data_ptr<float>() + at, n);
        at += n;
      }
    };
  };
  c.streamed_optimizer = {{"exp_avg/w", {300, 7}, pieces(w, {1, 999, 13, 1087})},
                          {"exp_avg/v", {11}, pieces(v, {4, 7})}};
  write_checkpoint(path, c);
  const Checkpoint back = read_checkpoint(path);
  EXPECT_TRUE(back.verified);
  EXPECT_EQ(back.optimizer_kind, "adamw");
  EXPECT_EQ(back.optimizer_step, 3);
  EXPECT_TRUE(back.optimizer.empty()) << "no LibTorch archive any more";
  ASSERT_EQ(back.optimizer_state.size(), 2u);
  EXPECT_EQ(back.optimizer_state[0].name, "exp_avg/w");
  EXPECT_EQ(back.optimizer_state[0].shape, (std::vector<std::int64_t>{300, 7}));
  // Read back whole, and in slices that start and end inside rows (as a rank's slice does):
  // the same elements.
  const auto read = [](const Checkpoint::StoredTensor& t, std::int64_t first, std::int64_t n) {
    at::Tensor out = at::empty({n}, at::kFloat);
    t.read(first, n, out.data_ptr<float>());
    return out;
  };
  EXPECT_TRUE(torch::equal(read(back.optimizer_state[0], 0, 2100), w.reshape(-1)));
  EXPECT_TRUE(torch::equal(read(back.optimizer_state[1], 0, 11), v));
  for (const auto& [first, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {0, 7}, {3, 4}, {5, 700}, {699, 1}, {1000, 1100}, {2099, 1}}) {
    EXPECT_TRUE(
        torch::equal(read(back.optimizer_state[0], first, n), w.reshape(-1).narrow(0, first, n)))
        << first << " " << n;
  }
  // A fill that gives fewer elements than the shape is an internal error; nothing is written.
  c.streamed_optimizer[1].fill = pieces(v.narrow(0, 0, 10), {10});
  EXPECT_THROW(write_checkpoint(path, c), Error);
  EXPECT_EQ(read_checkpoint(path).step, 3) << "the checkpoint before is untouched";
  std::remove(path.c_str());
  for (const auto& older : older_checkpoints(path))
    std::remove(older.c_str());
}

TEST(Checkpoint, MemoryModelsRoundTripPerRankAndOlderFilesHaveNone) {
  const std::string path = "/tmp/autoaccum-unit-memory-" + std::to_string(::getpid()) + ".h5";
  Checkpoint c;
  c.params = {{"w", torch::ones({2})}};
  c.world_size = 3;
  // Rank 1 has no point yet; the values keep every bit (float64).
  c.memory_models = {{{1.0 / 3, 2.0 / 7, 123456789.125, 64, 4096, 987654321.5}, 96, 3e6, 0.01 / 3},
                     {{}, 0, 0, 0},
                     {{8, 0, 1048576.75}, 0, 1e6, 0}};
  write_checkpoint(path, c);
  const Checkpoint back = read_checkpoint(path);
  ASSERT_EQ(back.memory_models.size(), 3u);
  for (std::size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(back.memory_models[r].points, c.memory_models[r].points) << "rank " << r;
    EXPECT_EQ(back.memory_models[r].failed_units, c.memory_models[r].failed_units);
    EXPECT_EQ(back.memory_models[r].base, c.memory_models[r].base);
    EXPECT_EQ(back.memory_models[r].width_ratio, c.memory_models[r].width_ratio);
  }
  c.memory_models.clear();  // a fixed micro-batch, or a checkpoint from before they were kept
  write_checkpoint(path, c);
  EXPECT_TRUE(read_checkpoint(path).memory_models.empty());
  std::remove(path.c_str());
  std::remove(older_checkpoint_path(path, 0).c_str());
}

TEST(Checkpoint, TimeFitsRoundTripEveryBitAndARankWithoutOneStaysWithout) {
  const std::string path = "/tmp/autoaccum-unit-time-" + std::to_string(::getpid()) + ".h5";
  Checkpoint c;
  c.params = {{"w", torch::ones({2})}};
  c.world_size = 3;
  // Rank 1 fitted nothing (-1 everywhere); the others keep every bit (float64).
  c.time_fits = {{4.5e-3 / 3, 23e-6 / 7, 0.14e-6 / 11}, {}, {1.0 / 3, 2.0 / 3, 0}};
  write_checkpoint(path, c);
  const Checkpoint back = read_checkpoint(path);
  ASSERT_EQ(back.time_fits.size(), 3u);
  for (std::size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(back.time_fits[r].fixed, c.time_fits[r].fixed) << "rank " << r;
    EXPECT_EQ(back.time_fits[r].per_unit, c.time_fits[r].per_unit) << "rank " << r;
    EXPECT_EQ(back.time_fits[r].per_square, c.time_fits[r].per_square) << "rank " << r;
  }
  EXPECT_LT(back.time_fits[1].per_unit, 0);
  c.time_fits.clear();  // documents cut by the fewest pieces, or rows
  write_checkpoint(path, c);
  EXPECT_TRUE(read_checkpoint(path).time_fits.empty());
  std::remove(path.c_str());
  std::remove(older_checkpoint_path(path, 0).c_str());
}

TEST(Checkpoint, PerRankSizesAndSharesRoundTripAndAnAbsentListReadsEmpty) {
  const std::string path = "/tmp/autoaccum-unit-shares-" + std::to_string(::getpid()) + ".h5";
  Checkpoint c;
  c.params = {{"w", torch::ones({2})}};
  c.world_size = 3;
  c.micro_batches = {40, 7, 40};
  c.shares = {50, 7, 63};
  c.shares_after = {52, 6, 62};
  c.shares_followed = {40, 40, 40};
  write_checkpoint(path, c);
  Checkpoint back = read_checkpoint(path);
  EXPECT_EQ(back.micro_batches, c.micro_batches);
  EXPECT_EQ(back.shares, c.shares);
  EXPECT_EQ(back.shares_after, c.shares_after);
  EXPECT_EQ(back.shares_followed, c.shares_followed);
  c.shares_followed.clear();  // no automatic size followed the shares, or an older checkpoint
  write_checkpoint(path, c);
  back = read_checkpoint(path);
  EXPECT_TRUE(back.shares_followed.empty());
  EXPECT_EQ(back.shares, c.shares);
  std::remove(path.c_str());
  std::remove(older_checkpoint_path(path, 0).c_str());
}

// A checkpoint with a dataset of every kind --resume reads.
Checkpoint of_every_kind(std::int64_t step) {
  Checkpoint c;
  c.step = step;
  c.world_size = 2;
  c.micro_batch = 8;
  c.params = {{"layer.weight", torch::full({64, 32}, static_cast<float>(step))},
              {"layer.bias", torch::zeros({32})}};
  c.buffers = {{"norm.running_mean", torch::ones({32})}};
  c.optimizer = std::string(4096, static_cast<char>(step));
  c.generator_states = {std::string(512, 'a'), std::string(512, 'b')};
  c.micro_batches = {8, 8};
  c.memory_models = {{{8, 0, 1e6}, 0, 5e5, 0}, {{8, 0, 1e6}, 0, 5e5, 0}};
  return c;
}

// Flips one bit in the middle of a contiguous dataset's bytes on disk, as a failing disk would.
void flip_a_bit(const std::string& path, const std::string& dataset, hdf5::DType type) {
  std::int64_t offset = 0, bytes = 0;
  {
    const auto file = hdf5::File::open(path);
    const auto d = file.dataset(dataset);
    const auto at = d.raw_offset(type);
    ASSERT_TRUE(at.has_value()) << dataset << " is contiguous";
    offset = *at;
    bytes = 1;
    for (const auto dim : d.shape())
      bytes *= dim;
    bytes *= type == hdf5::DType::kUInt8 ? 1 : type == hdf5::DType::kFloat32 ? 4 : 8;
  }
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char byte = 0;
  const off_t where = static_cast<off_t>(offset + bytes / 2);
  ASSERT_EQ(::pread(fd, &byte, 1, where), 1);
  byte ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &byte, 1, where), 1);
  ::close(fd);
}

std::string unit_path(const std::string& name) {
  return "/tmp/autoaccum-unit-" + name + "-" + std::to_string(::getpid()) + ".h5";
}

void remove_all(const std::string& path) {
  std::remove(path.c_str());
  for (const auto& older : older_checkpoints(path))
    std::remove(older.c_str());
}

TEST(Checkpoint, EveryDatasetIsVerifiedAndABitFlipInAnyNamesItAndFallsBack) {
  const std::vector<std::pair<std::string, hdf5::DType>> datasets = {
      {"params/layer.weight", hdf5::DType::kFloat32},
      {"buffers/norm.running_mean", hdf5::DType::kFloat32},
      {"optimizer/state", hdf5::DType::kUInt8},
      {"rng/rank1", hdf5::DType::kUInt8},
      {"memory_model/points", hdf5::DType::kFloat64},
      {"micro_batches", hdf5::DType::kInt64}};
  for (const auto& [dataset, type] : datasets) {
    const std::string path = unit_path("flip");
    write_checkpoint(path, of_every_kind(10));
    write_checkpoint(path, of_every_kind(20));
    const Checkpoint whole = read_checkpoint(path);
    EXPECT_TRUE(whole.verified);
    EXPECT_EQ(whole.verified_datasets, 9)
        << "2 parameters, a buffer, the optimizer, 2 generators, micro_batches, 2 memory model";
    flip_a_bit(path, dataset, type);
    try {
      read_checkpoint(path);
      ADD_FAILURE() << "a flipped bit in " << dataset << " was read without a word";
    } catch (const CheckpointDamaged& e) {
      EXPECT_NE(std::string(e.what()).find("dataset '" + dataset + "' does not match its checksum"),
                std::string::npos)
          << e.what();
    }
    const auto loaded = read_latest_checkpoint(path);
    ASSERT_TRUE(loaded.has_value());
    EXPECT_EQ(loaded->checkpoint.step, 10) << dataset;
    EXPECT_EQ(loaded->path, older_checkpoint_path(path, 10));
    ASSERT_EQ(loaded->skipped.size(), 1u);
    EXPECT_NE(loaded->skipped[0].why.find(dataset), std::string::npos) << loaded->skipped[0].why;
    remove_all(path);
  }
}

TEST(Checkpoint, ALargeTensorIsReadAndVerifiedInPiecesAndAFlipInAnyPieceIsFound) {
  // 48 MiB of parameters and 40 MiB of optimizer bytes: read in 32 MiB pieces, each hashed while
  // the next is read. Equal values back, then a flip near the end (in the last piece) is found.
  const std::string path = unit_path("pieces");
  Checkpoint c;
  c.step = 1;
  c.params = {{"big", torch::arange(12 << 20, torch::kFloat).reshape({3 << 10, 4 << 10})}};
  c.optimizer.resize(std::size_t{40} << 20);
  for (std::size_t i = 0; i < c.optimizer.size(); i += 977)
    c.optimizer[i] = static_cast<char>(i % 251);
  write_checkpoint(path, c, 1);
  const Checkpoint back = read_checkpoint(path);
  EXPECT_TRUE(back.verified);
  EXPECT_TRUE(torch::equal(back.params.at(0).second, c.params[0].second));
  EXPECT_EQ(back.optimizer, c.optimizer);
  for (const auto& [dataset, type] : std::vector<std::pair<std::string, hdf5::DType>>{
           {"params/big", hdf5::DType::kFloat32}, {"optimizer/state", hdf5::DType::kUInt8}}) {
    write_checkpoint(path, c, 1);
    std::int64_t offset = 0, bytes = 0;
    {
      const auto file = hdf5::File::open(path);
      offset = *file.dataset(dataset).raw_offset(type);
      bytes = dataset == "optimizer/state" ? static_cast<std::int64_t>(c.optimizer.size())
                                           : c.params[0].second.nbytes();
    }
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const unsigned char byte = 0x5a;
    ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(offset + bytes - 3)), 1);
    ::close(fd);
    EXPECT_THROW(read_checkpoint(path), CheckpointDamaged) << dataset;
  }
  remove_all(path);
}

TEST(Checkpoint, AChangedAttributeATruncatedFileAndNoWholeOneAreRefused) {
  const std::string path = unit_path("attributes");
  write_checkpoint(path, of_every_kind(10));
  write_checkpoint(path, of_every_kind(20));
  {  // the step changed behind autoaccum's back
    auto file = hdf5::File::open(path, /*writable=*/true);
    file.write_attribute("step", std::int64_t{21});
    file.close();
  }
  EXPECT_THROW(
      {
        try {
          read_checkpoint(path);
        } catch (const CheckpointDamaged& e) {
          EXPECT_NE(std::string(e.what()).find("attributes"), std::string::npos) << e.what();
          throw;
        }
      },
      CheckpointDamaged);
  // The newest truncated to half: falls back; the older truncated too: nothing to resume from.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  auto loaded = read_latest_checkpoint(path);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->checkpoint.step, 10);
  const std::string older = older_checkpoint_path(path, 10);
  std::filesystem::resize_file(older, std::filesystem::file_size(older) / 2);
  try {
    read_latest_checkpoint(path);
    ADD_FAILURE() << "two truncated checkpoints were read";
  } catch (const CheckpointDamaged& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no checkpoint of"), std::string::npos) << what;
    EXPECT_NE(what.find(older), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line";
  }
  remove_all(path);
}

TEST(Checkpoint, TheLastNAreKeptNamedByStepAndAnOlderVersionsPrevIsReadThenRemoved) {
  const std::string path = unit_path("keep");
  const std::string stem = path.substr(0, path.size() - 3);
  for (std::int64_t step = 10; step <= 50; step += 10)
    write_checkpoint(path, of_every_kind(step), 3);
  EXPECT_EQ(read_checkpoint(path).step, 50);
  const std::vector<std::string> expected = {stem + ".step40.h5", stem + ".step30.h5"};
  EXPECT_EQ(older_checkpoints(path), expected);
  EXPECT_EQ(read_checkpoint(expected[1]).step, 30);
  write_checkpoint(path, of_every_kind(60), 1);
  EXPECT_TRUE(older_checkpoints(path).empty()) << "--keep-checkpoints 1 keeps the newest only";

  // A checkpoint file of an autoaccum before checksums (as `.prev`): read unverified, and found
  // by --resume when the newest is gone.
  const std::string prev = path + ".prev";
  std::filesystem::copy_file(path, prev);
  {
    auto file = hdf5::File::open(prev, /*writable=*/true);
    for (const auto& name : {"params/layer.weight", "optimizer/state"}) {
      const hid_t d = H5Dopen2(file.id(), name, H5P_DEFAULT);
      ASSERT_GE(H5Adelete(d, "checksum"), 0);
      H5Dclose(d);
    }
    ASSERT_GE(H5Adelete(file.id(), "checksum"), 0);
    file.close();
  }
  std::remove(path.c_str());
  const auto loaded = read_latest_checkpoint(path);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->path, prev);
  EXPECT_FALSE(loaded->checkpoint.verified);
  EXPECT_EQ(loaded->checkpoint.step, 60);
  write_checkpoint(path, of_every_kind(70), 2);
  EXPECT_NE(::access(prev.c_str(), F_OK), 0) << "a whole newer one replaces the old .prev";
  EXPECT_EQ(older_checkpoints(path), std::vector<std::string>{});
  write_checkpoint(path, of_every_kind(80), 2);
  EXPECT_EQ(older_checkpoints(path), std::vector<std::string>{stem + ".step70.h5"});
  remove_all(path);
}

TEST(Checkpoint, AnUnreadableFileInTheCheckpointsPlaceIsMovedAsideNotReplacedUnseen) {
  const std::string path = unit_path("aside");
  const std::string aside = path + ".damaged";
  std::remove(aside.c_str());
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("not an HDF5 file: a checkpoint cut short by a full disk, say\n", f);
    std::fclose(f);
  }
  write_checkpoint(path, of_every_kind(10), 2);
  EXPECT_EQ(read_checkpoint(path).step, 10);
  ASSERT_EQ(::access(aside.c_str(), F_OK), 0) << "the unreadable file is kept, renamed";
  std::FILE* f = std::fopen(aside.c_str(), "r");
  char line[32] = {};
  ASSERT_NE(std::fgets(line, sizeof(line), f), nullptr);
  std::fclose(f);
  EXPECT_EQ(std::string(line).rfind("not an HDF5 file", 0), 0u);
  EXPECT_TRUE(older_checkpoints(path).empty()) << "and it is not taken for an older checkpoint";
  std::remove(aside.c_str());
  remove_all(path);
}

}  // namespace
}  // namespace autoaccum::io
