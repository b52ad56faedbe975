// Checkpoint I/O through the HDF5 layer.
#include "autoaccum/io/checkpoint.hpp"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>

#include "autoaccum/core/atomic_write.hpp"
#include "autoaccum/core/checksum.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/hdf5/checksums.hpp"
#include "autoaccum/hdf5/hdf5.hpp"
#include "checkpoint_files.hpp"

namespace autoaccum::io {
namespace {

constexpr const char* kFormat = kCheckpointFormat;

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

// Host memory a tensor passes through on its way to the file (from a GPU, or converted).
constexpr std::int64_t kPieceBytes = std::int64_t{8} << 20;

// Types HDF5 files here do not hold are stored widened (bool as uint8, other integers as int64,
// half precisions as float32); loading copies them back into the model's own type.
at::ScalarType stored_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
    case at::kDouble:
    case at::kLong:
    case at::kByte:
      return type;
    case at::kBool:
      return at::kByte;
    case at::kHalf:
    case at::kBFloat16:
      return at::kFloat;
    default:
      return at::isIntegralType(type, false) ? at::kLong : type;
  }
}

hdf5::DType dtype_of(at::ScalarType type, const std::string& name) {
  switch (type) {
    case at::kFloat:
      return hdf5::DType::kFloat32;
    case at::kDouble:
      return hdf5::DType::kFloat64;
    case at::kLong:
      return hdf5::DType::kInt64;
    case at::kByte:
      return hdf5::DType::kUInt8;
    default:
      throw Error("checkpoint: tensor '" + name + "' has an unsupported type");
  }
}

at::ScalarType scalar_of(hdf5::DType type) {
  switch (type) {
    case hdf5::DType::kFloat32:
      return at::kFloat;
    case hdf5::DType::kFloat64:
      return at::kDouble;
    case hdf5::DType::kInt64:
      return at::kLong;
    case hdf5::DType::kUInt8:
      return at::kByte;
    default:
      return at::kFloat;
  }
}

std::int64_t stored_bytes(const at::Tensor& t) {
  return t.numel() * static_cast<std::int64_t>(at::elementSize(stored_type(t.scalar_type())));
}

// A host tensor of the stored type goes to the file straight from its memory; any other (on a
// GPU, of another type, not contiguous) in pieces of whole rows of at most kPieceBytes (or one
// row).
void write_tensor(hdf5::File& file, const std::string& name, const at::Tensor& tensor,
                  const WrittenSums& sums) {
  const at::Tensor source = tensor.detach();
  const at::ScalarType type = stored_type(source.scalar_type());
  const auto dtype = dtype_of(type, name);
  std::vector<std::int64_t> shape(source.sizes().begin(), source.sizes().end());
  if (shape.empty()) shape = {1};
  auto dataset = file.create_dataset(name, dtype, shape);
  Checksum sum;
  if (source.numel() == 0) {
    sums.store(dataset, sum);
    return;
  }
  if (source.is_cpu() && source.is_contiguous() && source.scalar_type() == type) {
    sums.add_while(sum, source.data_ptr(), static_cast<std::size_t>(source.nbytes()),
                   [&] { dataset.write_rows(0, shape[0], dtype, source.data_ptr()); });
    sums.store(dataset, sum);
    return;
  }
  const at::Tensor rows = source.reshape({shape[0], -1});
  const std::int64_t row_bytes = rows.size(1) * static_cast<std::int64_t>(at::elementSize(type));
  const std::int64_t step =
      std::max<std::int64_t>(1, kPieceBytes / std::max<std::int64_t>(1, row_bytes));
  for (std::int64_t first = 0; first < shape[0]; first += step) {
    const std::int64_t count = std::min(step, shape[0] - first);
    const at::Tensor piece = rows.narrow(0, first, count).to(at::kCPU).to(type).contiguous();
    sums.add_while(sum, piece.data_ptr(), static_cast<std::size_t>(piece.nbytes()),
                   [&] { dataset.write_rows(first, count, dtype, piece.data_ptr()); });
  }
  sums.store(dataset, sum);
}

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

at::Tensor read_tensor(const hdf5::File& file, const std::string& name, Verifier& verifier) {
  auto dataset = file.dataset(name);
  const auto shape = dataset.shape();
  const auto type = dataset.dtype();
  if (type == hdf5::DType::kOther)
    throw InputError("'" + file.path() + "', dataset '" + name + "' has an unsupported type");
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(scalar_of(type)));
  const std::int64_t rows = t.numel() > 0 ? shape.at(0) : 0;
  verifier.read_checked(dataset, rows, rows > 0 ? static_cast<std::int64_t>(t.nbytes()) / rows : 0,
                        type, t.data_ptr());
  return t;
}

std::vector<std::string> names_under(const hdf5::File& file, const std::string& group) {
  std::vector<std::string> out;
  // The HDF5 layer lists only the root, so names are recorded in an attribute at write time.
  if (file.has_attribute(group + "_names")) out = file.read_string_list_attribute(group + "_names");
  return out;
}

// A 1-D int64 dataset (written only when `values` is not empty; read back empty when absent, as
// in checkpoints from before it existed).
void write_integers(hdf5::File& file, const std::string& name,
                    const std::vector<std::int64_t>& values, const WrittenSums& sums) {
  if (values.empty()) return;
  auto dataset =
      file.create_dataset(name, hdf5::DType::kInt64, {static_cast<std::int64_t>(values.size())});
  dataset.write_rows(0, static_cast<std::int64_t>(values.size()), hdf5::DType::kInt64,
                     values.data());
  sums.store(dataset, values.data(), values.size() * sizeof(std::int64_t));
}

// A dataset of bytes (an opaque state) with its checksum.
void write_bytes(hdf5::File& file, const std::string& name, const std::string& bytes,
                 const WrittenSums& sums) {
  auto dataset =
      file.create_dataset(name, hdf5::DType::kUInt8, {static_cast<std::int64_t>(bytes.size())});
  if (!bytes.empty())
    dataset.write_rows(0, static_cast<std::int64_t>(bytes.size()), hdf5::DType::kUInt8,
                       bytes.data());
  sums.store(dataset, bytes.data(), bytes.size());
}

// memory_model/points [n, 4] and memory_model/ranks [W, 3], float64 (see Checkpoint).
void write_memory_models(hdf5::File& file, const std::vector<Checkpoint::MemoryModelRecord>& m,
                         const WrittenSums& sums) {
  if (m.empty()) return;
  std::vector<double> points, ranks;
  for (std::size_t r = 0; r < m.size(); ++r) {
    for (std::size_t i = 0; i + 3 <= m[r].points.size(); i += 3)
      points.insert(points.end(), {static_cast<double>(r), m[r].points[i], m[r].points[i + 1],
                                   m[r].points[i + 2]});
    ranks.insert(ranks.end(), {m[r].failed_units, m[r].base, m[r].width_ratio});
  }
  const auto rows = static_cast<std::int64_t>(points.size() / 4);
  auto p = file.create_dataset("memory_model/points", hdf5::DType::kFloat64, {rows, 4});
  if (rows > 0) p.write_rows(0, rows, hdf5::DType::kFloat64, points.data());
  sums.store(p, points.data(), points.size() * 8);
  const auto world = static_cast<std::int64_t>(m.size());
  auto r = file.create_dataset("memory_model/ranks", hdf5::DType::kFloat64, {world, 3});
  r.write_rows(0, world, hdf5::DType::kFloat64, ranks.data());
  sums.store(r, ranks.data(), ranks.size() * 8);
}

std::vector<Checkpoint::MemoryModelRecord> read_memory_models(hdf5::File& file,
                                                              Verifier& verifier) {
  std::vector<Checkpoint::MemoryModelRecord> m;
  if (!file.has_dataset("memory_model/ranks") || !file.has_dataset("memory_model/points")) return m;
  auto ranks = file.dataset("memory_model/ranks");
  auto points = file.dataset("memory_model/points");
  const auto rank_shape = ranks.shape(), point_shape = points.shape();
  if (rank_shape.size() != 2 || rank_shape[1] != 3 || point_shape.size() != 2 ||
      point_shape[1] != 4)
    throw InputError("its memory_model datasets do not have the shapes [W, 3] and [n, 4]");
  std::vector<double> r(static_cast<std::size_t>(rank_shape[0] * 3)),
      p(static_cast<std::size_t>(point_shape[0] * 4));
  if (!r.empty()) ranks.read_rows(0, rank_shape[0], hdf5::DType::kFloat64, r.data());
  if (!p.empty()) points.read_rows(0, point_shape[0], hdf5::DType::kFloat64, p.data());
  verifier.check(ranks, r.data(), r.size() * 8);
  verifier.check(points, p.data(), p.size() * 8);
  m.resize(static_cast<std::size_t>(rank_shape[0]));
  for (std::size_t i = 0; i < m.size(); ++i)
    m[i] = Checkpoint::MemoryModelRecord{{}, r[3 * i], r[3 * i + 1], r[3 * i + 2]};
  for (std::size_t i = 0; i + 4 <= p.size(); i += 4) {
    const double rank = p[i];
    if (!(rank >= 0 && rank < static_cast<double>(m.size())))
      throw InputError("its memory_model/points name rank " + std::to_string(rank) + " of " +
                       std::to_string(m.size()));
    auto& into = m[static_cast<std::size_t>(rank)].points;
    into.insert(into.end(), {p[i + 1], p[i + 2], p[i + 3]});
  }
  return m;
}

std::vector<std::int64_t> read_integers(hdf5::File& file, const std::string& name,
                                        Verifier& verifier) {
  std::vector<std::int64_t> values;
  if (!file.has_dataset(name)) return values;
  auto dataset = file.dataset(name);
  values.resize(static_cast<std::size_t>(dataset.shape().at(0)));
  if (!values.empty())
    dataset.read_rows(0, static_cast<std::int64_t>(values.size()), hdf5::DType::kInt64,
                      values.data());
  verifier.check(dataset, values.data(), values.size() * sizeof(std::int64_t));
  return values;
}

// A dataset of bytes, verified.
std::string read_bytes(hdf5::File& file, const std::string& name, Verifier& verifier) {
  auto dataset = file.dataset(name);
  std::string bytes(static_cast<std::size_t>(dataset.shape().at(0)), '\0');
  verifier.read_checked(dataset, static_cast<std::int64_t>(bytes.size()), 1, hdf5::DType::kUInt8,
                        bytes.data());
  return bytes;
}

// The optimizer's bytes: held, or streamed (twice: measured, then written).
std::int64_t optimizer_size(const Checkpoint& c) {
  if (!c.stream_optimizer) return static_cast<std::int64_t>(c.optimizer.size());
  std::int64_t size = 0;
  c.stream_optimizer([&](const void*, std::size_t n) {
    size += static_cast<std::int64_t>(n);
    return n;
  });
  return size;
}

void write_optimizer(hdf5::File& file, const Checkpoint& c, std::int64_t size,
                     const WrittenSums& sums) {
  auto state = file.create_dataset("optimizer/state", hdf5::DType::kUInt8, {size});
  if (!c.stream_optimizer) {
    Checksum sum;
    sums.add_while(sum, c.optimizer.data(), c.optimizer.size(), [&] {
      if (size > 0) state.write_rows(0, size, hdf5::DType::kUInt8, c.optimizer.data());
    });
    sums.store(state, sum);
    return;
  }
  Checksum sum;
  // LibTorch's writer calls the sink from C code (miniz): a failure is returned as "took
  // nothing", and thrown here once LibTorch has given up.
  std::int64_t at = 0;
  std::string failure;
  try {
    c.stream_optimizer([&](const void* data, std::size_t n) -> std::size_t {
      if (!failure.empty()) return 0;
      const auto count = static_cast<std::int64_t>(n);
      if (at + count > size) {
        failure = "internal: the optimizer state grew between measuring and writing it";
        return 0;
      }
      try {
        sums.add_while(sum, data, n, [&] {
          if (count > 0) state.write_rows(at, count, hdf5::DType::kUInt8, data);
        });
      } catch (const std::exception& e) {
        failure = e.what();
        return 0;
      }
      at += count;
      return n;
    });
  } catch (const std::exception& e) {
    if (failure.empty()) throw;
  }
  if (!failure.empty()) throw InputError(failure);
  if (at != size)
    throw Error("internal: the optimizer state shrank between measuring and writing it");
  sums.store(state, sum);
}

// A float32 tensor from pieces of any size: staged into whole rows, written at most
// kPieceBytes at a time.
void write_streamed(hdf5::File& file, const Checkpoint::StreamedTensor& t,
                    const WrittenSums& sums) {
  std::vector<std::int64_t> shape = t.shape;
  if (shape.empty()) shape = {1};
  std::int64_t numel = 1;
  for (const std::int64_t extent : shape)
    numel *= extent;
  const std::string name = "optimizer/" + t.name;
  auto dataset = file.create_dataset(name, hdf5::DType::kFloat32, shape);
  Checksum sum;
  const std::int64_t row = shape[0] > 0 ? numel / shape[0] : 0;
  const std::int64_t rows_per_write =
      std::max<std::int64_t>(1, kPieceBytes / 4 / std::max<std::int64_t>(1, row));
  const std::int64_t capacity = std::min(numel, rows_per_write * row);
  std::vector<float> staged;
  staged.reserve(static_cast<std::size_t>(capacity));
  std::int64_t rows_written = 0, given = 0;
  const auto flush = [&] {
    const auto rows = static_cast<std::int64_t>(staged.size()) / std::max<std::int64_t>(1, row);
    if (rows == 0) return;
    sums.add_while(sum, staged.data(), staged.size() * sizeof(float), [&] {
      dataset.write_rows(rows_written, rows, hdf5::DType::kFloat32, staged.data());
    });
    rows_written += rows;
    staged.clear();
  };
  t.fill([&](const float* data, std::int64_t count) {
    given += count;
    if (given > numel)
      throw Error("internal: optimizer state '" + t.name + "' was given more elements than it has");
    while (count > 0) {
      const std::int64_t take =
          std::min(count, capacity - static_cast<std::int64_t>(staged.size()));
      staged.insert(staged.end(), data, data + take);
      data += take;
      count -= take;
      if (static_cast<std::int64_t>(staged.size()) == capacity) flush();
    }
  });
  flush();
  if (given != numel)
    throw Error("internal: optimizer state '" + t.name + "' was given " + std::to_string(given) +
                " of its " + std::to_string(numel) + " elements");
  sums.store(dataset, sum);
}

// An upper bound of the file's size: its data, and what HDF5 adds (measured: about 8 KiB, 220
// bytes per dataset for 400 datasets, 1.1 KiB per dataset for 12; here 8 KiB + 1 KiB per
// dataset + the attributes' bytes twice).
std::int64_t size_bound(const Checkpoint& c, std::int64_t optimizer_bytes) {
  std::int64_t data = optimizer_bytes;
  std::int64_t datasets = 9;  // optimizer/state, the 4 integer lists, the memory models, spare
  std::int64_t names = 0;
  for (const auto& t : c.streamed_optimizer) {
    std::int64_t numel = 1;
    for (const std::int64_t extent : t.shape)
      numel *= extent;
    data += 4 * numel;
    names += 2 * (static_cast<std::int64_t>(t.name.size()) + 1);
    ++datasets;
  }
  for (const auto* list : {&c.params, &c.buffers}) {
    for (const auto& [name, tensor] : *list) {
      data += stored_bytes(tensor);
      names += static_cast<std::int64_t>(name.size()) + 1;
      ++datasets;
    }
  }
  for (const auto& state : c.generator_states) {
    data += static_cast<std::int64_t>(state.size());
    ++datasets;
  }
  data += 8 * static_cast<std::int64_t>(c.micro_batches.size() + c.shares.size() +
                                        c.shares_after.size() + c.shares_followed.size());
  for (const auto& m : c.memory_models)  // 4 doubles a point, 3 a rank
    data += 8 * static_cast<std::int64_t>(m.points.size() / 3 * 4 + 3);
  std::int64_t longest = 0;  // the name lists are fixed-width strings
  for (const auto* list : {&c.params, &c.buffers})
    for (const auto& named : *list)
      longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(named.first.size()) + 1);
  const auto listed = static_cast<std::int64_t>(c.params.size() + c.buffers.size());
  std::int64_t attributes = 1024 + listed * longest + names;
  for (const auto& f : c.replica_fingerprints)
    attributes += static_cast<std::int64_t>(f.size()) + 1;
  for (const auto& f : c.data.files)
    attributes += static_cast<std::int64_t>(f.size()) + 1;
  // A checksum attribute is about 100 bytes of each dataset's header (within the 1 KiB).
  return data + 8192 + 1024 * datasets + 2 * attributes;
}

}  // namespace

std::int64_t write_checkpoint(const std::string& path, const Checkpoint& c, int keep,
                              Checksums checksums) {
  if (keep < 1) throw UsageError("--keep-checkpoints must be at least 1");
  const WrittenSums sums{checksums == Checksums::kOn};
  std::int64_t written = 0;
  write_atomically(path, [&](const std::string& temporary) {
    const std::int64_t optimizer_bytes = optimizer_size(c);
    const std::int64_t bound = size_bound(c, optimizer_bytes);
    // Room first, before HDF5 has anything to write: HDF5 1.14 can crash closing a file whose
    // writes failed on a full disk. The reserved blocks take every later write.
    check_free_space(temporary, static_cast<std::uint64_t>(bound));
    auto file = hdf5::File::create(temporary);
    reserve_space(temporary, static_cast<std::uint64_t>(bound));
    std::vector<std::string> param_names, buffer_names;
    for (const auto& [name, tensor] : c.params) {
      write_tensor(file, "params/" + name, tensor, sums);
      param_names.push_back(name);
    }
    for (const auto& [name, tensor] : c.buffers) {
      write_tensor(file, "buffers/" + name, tensor, sums);
      buffer_names.push_back(name);
    }
    if (c.stream_optimizer || !c.optimizer.empty()) write_optimizer(file, c, optimizer_bytes, sums);
    std::vector<std::string> optimizer_names;
    for (const auto& t : c.streamed_optimizer) {
      write_streamed(file, t, sums);
      optimizer_names.push_back(t.name);
    }
    if (!c.optimizer_kind.empty()) {
      file.write_attribute("optimizer_kind", c.optimizer_kind);
      file.write_attribute("optimizer_step", c.optimizer_step);
      if (!optimizer_names.empty()) file.write_attribute("optimizer_names", optimizer_names);
    }
    for (std::size_t r = 0; r < c.generator_states.size(); ++r)
      write_bytes(file, "rng/rank" + std::to_string(r), c.generator_states[r], sums);
    file.write_attribute("rng_ranks", static_cast<std::int64_t>(c.generator_states.size()));
    write_integers(file, "micro_batches", c.micro_batches, sums);
    write_integers(file, "shares", c.shares, sums);
    write_integers(file, "shares_after", c.shares_after, sums);
    write_integers(file, "shares_followed", c.shares_followed, sums);
    write_memory_models(file, c.memory_models, sums);
    file.write_attribute("params_names", param_names);
    file.write_attribute("buffers_names", buffer_names);
    file.write_attribute("format", std::string(kFormat));
    file.write_attribute("step", c.step);
    file.write_attribute("epoch", c.epoch);
    file.write_attribute("micro_batch", c.micro_batch);
    file.write_attribute("world_size", c.world_size);
    file.write_attribute("seed", static_cast<std::int64_t>(c.seed));
    file.write_attribute("loss_scale", c.loss_scale);
    file.write_attribute("loss_scale_clean_steps", c.loss_scale_clean_steps);
    if (!c.replica_fingerprints.empty())
      file.write_attribute("replica_fingerprints", c.replica_fingerprints);
    if (c.data.global_batch > 0) {
      file.write_attribute("data_global_batch", c.data.global_batch);
      if (c.data.global_batch_tokens > 0)
        file.write_attribute("data_global_batch_tokens", c.data.global_batch_tokens);
      file.write_attribute("data_shuffle", c.data.shuffle);
      file.write_attribute("data_rows", c.data.rows);
      file.write_attribute("data_files", c.data.files);
      file.write_attribute("data_fingerprint", c.data.fingerprint);
      file.write_attribute("data_batch_in_epoch", c.data.batch_in_epoch);
    }
    // Last: the root's checksum covers every attribute above.
    if (sums.on) file.write_attribute(kChecksumAttribute, hdf5::attributes_checksum(file));
    file.close();
    written = release_reserve(temporary);
    // The new one is complete: keep the current one under its step's name before it is
    // replaced.
    if (keep > 1) keep_current(path);
  });
  remove_beyond(path, keep);
  return written;
}

std::optional<LoadedCheckpoint> read_latest_checkpoint(const std::string& path) {
  std::vector<std::string> candidates;
  const bool have_newest = ::access(path.c_str(), F_OK) == 0;
  if (have_newest) candidates.push_back(path);
  for (const auto& older : older_checkpoints(path))
    candidates.push_back(older);
  if (candidates.empty()) return std::nullopt;
  // Any failure to read one goes on to the next: a checksum, HDF5's (a truncated file),
  // LibTorch's (a tensor it cannot make), or memory running out while reading.
  LoadedCheckpoint loaded;
  if (!have_newest)
    loaded.skipped.push_back({"", "'" + path +
                                      "' is missing (removed, or a kill on a file system without "
                                      "hard links)"});
  for (const auto& candidate : candidates) {
    try {
      loaded.checkpoint = read_checkpoint(candidate);
      loaded.path = candidate;
      return loaded;
    } catch (const std::exception& e) {
      loaded.skipped.push_back({candidate, e.what()});
    }
  }
  std::string all;
  for (const auto& skipped : loaded.skipped)
    all += (all.empty() ? "" : "; ") + skipped.why;
  throw CheckpointDamaged("--resume: no checkpoint of '" + path + "' reads whole: " + all);
}

Checkpoint read_checkpoint(const std::string& path, Checksums verify) {
  try {
    auto file = hdf5::File::open(path);
    if (!file.has_attribute("format") || file.read_string_attribute("format") != kFormat) {
      throw CheckpointDamaged("checkpoint '" + path + "' is not an autoaccum checkpoint");
    }
    Verifier verifier(file, path, verify == Checksums::kOn);
    Checkpoint c;
    c.step = file.read_int_attribute("step");
    c.epoch = file.read_int_attribute("epoch");
    c.micro_batch = file.read_int_attribute("micro_batch");
    c.micro_batches = read_integers(file, "micro_batches", verifier);
    c.shares = read_integers(file, "shares", verifier);
    c.shares_after = read_integers(file, "shares_after", verifier);
    c.shares_followed = read_integers(file, "shares_followed", verifier);
    c.memory_models = read_memory_models(file, verifier);
    c.world_size = file.read_int_attribute("world_size");
    c.seed = static_cast<std::uint64_t>(file.read_int_attribute("seed"));
    if (file.has_attribute("loss_scale")) {
      const hdf5::AttributeValue scale = file.attribute_value("loss_scale");
      if (const double* value = std::get_if<double>(&scale)) c.loss_scale = *value;
      c.loss_scale_clean_steps = file.read_int_attribute("loss_scale_clean_steps");
    }
    if (file.has_attribute("replica_fingerprints"))
      c.replica_fingerprints = file.read_string_list_attribute("replica_fingerprints");
    if (file.has_attribute("data_global_batch")) {
      c.data.global_batch = file.read_int_attribute("data_global_batch");
      if (file.has_attribute("data_global_batch_tokens"))
        c.data.global_batch_tokens = file.read_int_attribute("data_global_batch_tokens");
      c.data.shuffle = file.read_string_attribute("data_shuffle");
      c.data.rows = file.read_int_attribute("data_rows");
      c.data.files = file.read_string_list_attribute("data_files");
      c.data.fingerprint = file.read_string_attribute("data_fingerprint");
      c.data.batch_in_epoch = file.read_int_attribute("data_batch_in_epoch");
    }
    for (const auto& name : names_under(file, "params")) {
      c.params.emplace_back(name, read_tensor(file, "params/" + name, verifier));
    }
    for (const auto& name : names_under(file, "buffers")) {
      c.buffers.emplace_back(name, read_tensor(file, "buffers/" + name, verifier));
    }
    const std::int64_t rng_ranks =
        file.has_attribute("rng_ranks") ? file.read_int_attribute("rng_ranks") : 0;
    for (std::int64_t r = 0; r < rng_ranks; ++r)
      c.generator_states.push_back(read_bytes(file, "rng/rank" + std::to_string(r), verifier));
    if (file.has_dataset("optimizer/state"))
      c.optimizer = read_bytes(file, "optimizer/state", verifier);
    if (file.has_attribute("optimizer_kind")) {
      c.optimizer_kind = file.read_string_attribute("optimizer_kind");
      c.optimizer_step = file.read_int_attribute("optimizer_step");
      for (const auto& name : names_under(file, "optimizer"))
        c.optimizer_state.emplace_back(name, read_tensor(file, "optimizer/" + name, verifier));
    }
    c.verified = verifier.verified();
    c.verified_datasets = verifier.checked();
    return c;
  } catch (const CheckpointDamaged&) {
    throw;
  } catch (const InputError& e) {
    // HDF5's own failures: a truncated file, a dataset missing.
    throw CheckpointDamaged("checkpoint '" + path + "' cannot be read: " + e.what());
  }
}

}  // namespace autoaccum::io
