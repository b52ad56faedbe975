// Checkpoint datasets: each kind written with its checksum, read back verified.
#include "checkpoint_datasets.hpp"

#include <ATen/ATen.h>

#include "autoaccum/core/error.hpp"

namespace autoaccum::io {
namespace {

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

}  // namespace

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

Checkpoint::StoredTensor stored_tensor(const std::shared_ptr<hdf5::File>& file,
                                       const std::string& name, Verifier& verifier) {
  const hdf5::Dataset dataset = file->dataset(name);
  if (dataset.dtype() != hdf5::DType::kFloat32)
    throw CheckpointDamaged("checkpoint '" + file->path() + "': dataset '" + name + "' is " +
                            dataset.dtype_name() + ", not float32");
  Checkpoint::StoredTensor t;
  t.shape = dataset.shape();
  const std::int64_t numel = t.numel();
  const std::int64_t rows = numel > 0 ? t.shape.at(0) : 0;
  const std::int64_t per_row = rows > 0 ? numel / rows : 0;
  verifier.verify_in_pieces(dataset, rows, per_row * static_cast<std::int64_t>(sizeof(float)),
                            hdf5::DType::kFloat32);
  t.read = [file, name, per_row](std::int64_t first, std::int64_t count, float* out) {
    if (count <= 0) return;
    // The rows that hold the elements: at most one partial row at each end beyond them.
    const std::int64_t row0 = first / per_row;
    const std::int64_t row1 = (first + count + per_row - 1) / per_row;
    const hdf5::Dataset d = file->dataset(name);
    const std::int64_t skip = first - row0 * per_row;
    if (skip == 0 && (row1 - row0) * per_row == count) {
      d.read_rows(row0, row1 - row0, hdf5::DType::kFloat32, out);
      return;
    }
    std::vector<float> rows_read(static_cast<std::size_t>((row1 - row0) * per_row));
    d.read_rows(row0, row1 - row0, hdf5::DType::kFloat32, rows_read.data());
    std::copy_n(rows_read.begin() + skip, count, out);
  };
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

// memory_model/points [n, 4] and memory_model/ranks [W, 3], float64 (see Checkpoint; some
// older checkpoints' ranks are [W, 5]).
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

void write_time_fits(hdf5::File& file, const std::vector<Checkpoint::TimeFitRecord>& fits,
                     const WrittenSums& sums) {
  if (fits.empty()) return;
  std::vector<double> values;
  for (const auto& f : fits)
    values.insert(values.end(), {f.fixed, f.per_unit, f.per_square});
  const auto world = static_cast<std::int64_t>(fits.size());
  auto d = file.create_dataset("time_model/ranks", hdf5::DType::kFloat64, {world, 3});
  d.write_rows(0, world, hdf5::DType::kFloat64, values.data());
  sums.store(d, values.data(), values.size() * 8);
}

void read_time_fits(hdf5::File& file, Verifier& verifier,
                    std::vector<Checkpoint::TimeFitRecord>& time_fits) {
  if (!file.has_dataset("time_model/ranks")) return;
  auto d = file.dataset("time_model/ranks");
  const auto shape = d.shape();
  if (shape.size() != 2 || shape[1] != 3)
    throw InputError("its time_model/ranks dataset does not have the shape [W, 3]");
  std::vector<double> values(static_cast<std::size_t>(shape[0] * 3));
  if (!values.empty()) d.read_rows(0, shape[0], hdf5::DType::kFloat64, values.data());
  verifier.check(d, values.data(), values.size() * 8);
  time_fits.assign(static_cast<std::size_t>(shape[0]), {});
  for (std::size_t r = 0; r < time_fits.size(); ++r)
    time_fits[r] = {values[3 * r], values[3 * r + 1], values[3 * r + 2]};
}

std::vector<Checkpoint::MemoryModelRecord> read_memory_models(
    hdf5::File& file, Verifier& verifier, std::vector<Checkpoint::TimeFitRecord>& time_fits) {
  std::vector<Checkpoint::MemoryModelRecord> m;
  if (!file.has_dataset("memory_model/ranks") || !file.has_dataset("memory_model/points")) return m;
  auto ranks = file.dataset("memory_model/ranks");
  auto points = file.dataset("memory_model/points");
  const auto rank_shape = ranks.shape(), point_shape = points.shape();
  if (rank_shape.size() != 2 || (rank_shape[1] != 3 && rank_shape[1] != 5) ||
      point_shape.size() != 2 || point_shape[1] != 4)
    throw InputError("its memory_model datasets do not have the shapes [W, 3] and [n, 4]");
  const auto columns = static_cast<std::size_t>(rank_shape[1]);
  std::vector<double> r(static_cast<std::size_t>(rank_shape[0]) * columns),
      p(static_cast<std::size_t>(point_shape[0] * 4));
  if (!r.empty()) ranks.read_rows(0, rank_shape[0], hdf5::DType::kFloat64, r.data());
  if (!p.empty()) points.read_rows(0, point_shape[0], hdf5::DType::kFloat64, p.data());
  verifier.check(ranks, r.data(), r.size() * 8);
  verifier.check(points, p.data(), p.size() * 8);
  m.resize(static_cast<std::size_t>(rank_shape[0]));
  for (std::size_t i = 0; i < m.size(); ++i) {
    const double* row = r.data() + columns * i;
    m[i] = Checkpoint::MemoryModelRecord{{}, row[0], row[1], row[2]};
    if (columns == 5) {  // schema 13's fixed cost in padded tokens and seconds per padded token
      time_fits.resize(m.size());
      if (row[4] > 0) time_fits[i] = Checkpoint::TimeFitRecord{row[3] * row[4], row[4], 0};
    }
  }
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

}  // namespace autoaccum::io
