// How each kind of dataset of a checkpoint is written with its checksum and read back verified:
// tensors (from anywhere, in bounded pieces), tensors streamed in pieces of any size, integer
// lists, opaque bytes, the memory models (private to src/io; checkpoint.cpp puts them together).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "autoaccum/core/checksum.hpp"
#include "autoaccum/hdf5/checksums.hpp"
#include "autoaccum/hdf5/hdf5.hpp"
#include "autoaccum/io/checkpoint.hpp"

namespace autoaccum::io {

// The checksums a write computes and stores beside each dataset; none at all (not even
// computed) with Checksums::kOff, which only benchmarks ask for.
struct WrittenSums {
  bool on = true;
  void add(Checksum& sum, const void* data, std::size_t bytes) const {
    if (on) sum.add(data, bytes);
  }
  void store(hdf5::Dataset& dataset, const Checksum& sum) const {
    if (on) dataset.write_attribute(kChecksumAttribute, sum.text());
  }
  void store(hdf5::Dataset& dataset, const void* data, std::size_t bytes) const {
    if (on) dataset.write_attribute(kChecksumAttribute, Checksum::of(data, bytes));
  }
  // Runs `write` (which puts these same bytes in the file) while another thread adds them to
  // `sum`: with a core to spare, the checksum of a large tensor costs no time (it cost 10% of a
  // 281 MiB checkpoint's write when taken after it, docs/benchmarks.md).
  template <class Write>
  void add_while(Checksum& sum, const void* data, std::size_t bytes, Write&& write) const {
    constexpr std::size_t kWorthAThread = std::size_t{4} << 20;
    if (!on || bytes < kWorthAThread) {
      write();
      add(sum, data, bytes);
      return;
    }
    auto hashing = std::async(std::launch::async, [&sum, data, bytes] { sum.add(data, bytes); });
    try {
      write();
    } catch (...) {
      hashing.wait();
      throw;
    }
    hashing.get();
  }
};

// Checks each dataset read against the checksum written beside it. A file whose root carries
// a checksum was written with them, and then every dataset must match its own; in a file from
// before checksums, nothing is checked (and the checkpoint reads as unverified).
class Verifier {
 public:
  Verifier(const hdf5::File& file, const std::string& path, bool verify)
      : path_(path), required_(verify && file.has_attribute(kChecksumAttribute)) {
    if (!required_) return;
    const std::string stored = file.read_string_attribute(kChecksumAttribute);
    if (stored != hdf5::attributes_checksum(file))
      throw CheckpointDamaged("checkpoint '" + path_ +
                              "' is damaged: its attributes (step, tensor names, data order) do "
                              "not match their checksum");
  }
  // `data`, `bytes`: the dataset's elements just read, as memory holds them.
  void check(const hdf5::Dataset& dataset, const void* data, std::size_t bytes) {
    if (!required_) return;
    compare(dataset, Checksum::of(data, bytes));
  }
  // Reads all `rows` of `dataset` (of `row_bytes` each, as `type`) into `out` and checks them.
  // A large dataset is read in pieces, each hashed on a second thread while the next is read,
  // so that verifying costs little more than reading.
  void read_checked(const hdf5::Dataset& dataset, std::int64_t rows, std::int64_t row_bytes,
                    hdf5::DType type, void* out) {
    constexpr std::int64_t kPiece = std::int64_t{32} << 20;
    auto* bytes = static_cast<unsigned char*>(out);
    if (!required_ || rows * row_bytes <= kPiece) {
      if (rows > 0) dataset.read_rows(0, rows, type, out);
      check(dataset, out, static_cast<std::size_t>(rows * row_bytes));
      return;
    }
    Checksum sum;
    std::future<void> hashing;  // after `sum`: destroyed (waited for) first
    const std::int64_t step =
        std::max<std::int64_t>(1, kPiece / std::max<std::int64_t>(1, row_bytes));
    for (std::int64_t first = 0; first < rows; first += step) {
      const std::int64_t count = std::min(step, rows - first);
      unsigned char* piece = bytes + first * row_bytes;
      dataset.read_rows(first, count, type, piece);
      if (hashing.valid()) hashing.get();
      hashing = std::async(std::launch::async, [&sum, piece, n = count * row_bytes] {
        sum.add(piece, static_cast<std::size_t>(n));
      });
    }
    hashing.get();
    compare(dataset, sum.text());
  }

  // Checks all `rows` of `dataset` (of `row_bytes` each, as `type`) in pieces of at most 32 MiB
  // read into one buffer, keeping nothing: for a tensor read later in slices.
  void verify_in_pieces(const hdf5::Dataset& dataset, std::int64_t rows, std::int64_t row_bytes,
                        hdf5::DType type) {
    if (!required_) return;
    constexpr std::int64_t kPiece = std::int64_t{32} << 20;
    const std::int64_t step =
        std::max<std::int64_t>(1, kPiece / std::max<std::int64_t>(1, row_bytes));
    std::vector<unsigned char> piece(
        static_cast<std::size_t>(std::min(rows, step) * std::max<std::int64_t>(row_bytes, 0)));
    Checksum sum;
    for (std::int64_t first = 0; first < rows; first += step) {
      const std::int64_t count = std::min(step, rows - first);
      dataset.read_rows(first, count, type, piece.data());
      sum.add(piece.data(), static_cast<std::size_t>(count * row_bytes));
    }
    compare(dataset, sum.text());
  }

  bool verified() const { return required_; }
  std::int64_t checked() const { return checked_; }

 private:
  void compare(const hdf5::Dataset& dataset, const std::string& actual) {
    const char* problem = nullptr;
    switch (hdf5::verify_checksum(dataset, actual)) {
      case hdf5::Verdict::kVerified:
        ++checked_;
        return;
      case hdf5::Verdict::kDamaged:
        problem = "does not match its checksum";
        break;
      case hdf5::Verdict::kNoChecksum:
        problem = "has no checksum";
        break;
      case hdf5::Verdict::kUnknownAlgorithm:
        problem = "has a checksum of a kind this autoaccum does not know";
        break;
    }
    throw CheckpointDamaged("checkpoint '" + path_ + "' is damaged: dataset '" + dataset.name() +
                            "' " + problem);
  }

  std::string path_;
  bool required_;
  std::int64_t checked_ = 0;
};

// The bytes a tensor takes in the file (types the files do not hold are stored widened).
std::int64_t stored_bytes(const at::Tensor& t);
void write_tensor(hdf5::File& file, const std::string& name, const at::Tensor& tensor,
                  const WrittenSums& sums);
at::Tensor read_tensor(const hdf5::File& file, const std::string& name, Verifier& verifier);
// The float32 dataset `name` of `file` verified in pieces and left in the file, read on demand
// through `file` (kept open by the returned tensor's reader).
Checkpoint::StoredTensor stored_tensor(const std::shared_ptr<hdf5::File>& file,
                                       const std::string& name, Verifier& verifier);
// The names of a group's datasets, as the root attribute `<group>_names` lists them.
std::vector<std::string> names_under(const hdf5::File& file, const std::string& group);
void write_integers(hdf5::File& file, const std::string& name,
                    const std::vector<std::int64_t>& values, const WrittenSums& sums);
std::vector<std::int64_t> read_integers(hdf5::File& file, const std::string& name,
                                        Verifier& verifier);
void write_bytes(hdf5::File& file, const std::string& name, const std::string& bytes,
                 const WrittenSums& sums);
std::string read_bytes(hdf5::File& file, const std::string& name, Verifier& verifier);
void write_memory_models(hdf5::File& file, const std::vector<Checkpoint::MemoryModelRecord>& m,
                         const WrittenSums& sums);
// `time_fits`: filled from a schema 13 checkpoint's [W, 5] ranks (untouched otherwise).
std::vector<Checkpoint::MemoryModelRecord> read_memory_models(
    hdf5::File& file, Verifier& verifier, std::vector<Checkpoint::TimeFitRecord>& time_fits);
// time_model/ranks [W, 3], float64 (see Checkpoint): written when not empty; read when present
// (otherwise `time_fits` is left as it was).
void write_time_fits(hdf5::File& file, const std::vector<Checkpoint::TimeFitRecord>& fits,
                     const WrittenSums& sums);
void read_time_fits(hdf5::File& file, Verifier& verifier,
                    std::vector<Checkpoint::TimeFitRecord>& time_fits);
// LibTorch's optimizer archive at optimizer/state (as autoaccum wrote it before per-parameter
// state): its size, and the dataset.
std::int64_t optimizer_size(const Checkpoint& c);
void write_optimizer(hdf5::File& file, const Checkpoint& c, std::int64_t size,
                     const WrittenSums& sums);
// A float32 tensor under optimizer/ from pieces of any size.
void write_streamed(hdf5::File& file, const Checkpoint::StreamedTensor& t, const WrittenSums& sums);

}  // namespace autoaccum::io
