// Checkpoint I/O through the HDF5 layer.
#include "autoaccum/io/checkpoint.hpp"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "autoaccum/core/atomic_write.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/hdf5/hdf5.hpp"

namespace autoaccum::io {
namespace {

constexpr const char* kFormat = "autoaccum.checkpoint";

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
void write_tensor(hdf5::File& file, const std::string& name, const at::Tensor& tensor) {
  const at::Tensor source = tensor.detach();
  const at::ScalarType type = stored_type(source.scalar_type());
  const auto dtype = dtype_of(type, name);
  std::vector<std::int64_t> shape(source.sizes().begin(), source.sizes().end());
  if (shape.empty()) shape = {1};
  auto dataset = file.create_dataset(name, dtype, shape);
  if (source.numel() == 0) return;
  if (source.is_cpu() && source.is_contiguous() && source.scalar_type() == type) {
    dataset.write_rows(0, shape[0], dtype, source.data_ptr());
    return;
  }
  const at::Tensor rows = source.reshape({shape[0], -1});
  const std::int64_t row_bytes = rows.size(1) * static_cast<std::int64_t>(at::elementSize(type));
  const std::int64_t step =
      std::max<std::int64_t>(1, kPieceBytes / std::max<std::int64_t>(1, row_bytes));
  for (std::int64_t first = 0; first < shape[0]; first += step) {
    const std::int64_t count = std::min(step, shape[0] - first);
    const at::Tensor piece = rows.narrow(0, first, count).to(at::kCPU).to(type).contiguous();
    dataset.write_rows(first, count, dtype, piece.data_ptr());
  }
}

at::Tensor read_tensor(const hdf5::File& file, const std::string& name) {
  auto dataset = file.dataset(name);
  const auto shape = dataset.shape();
  const auto type = dataset.dtype();
  if (type == hdf5::DType::kOther)
    throw InputError("'" + file.path() + "', dataset '" + name + "' has an unsupported type");
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(scalar_of(type)));
  if (t.numel() > 0) dataset.read_rows(0, shape.at(0), type, t.data_ptr());
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
                    const std::vector<std::int64_t>& values) {
  if (values.empty()) return;
  auto dataset =
      file.create_dataset(name, hdf5::DType::kInt64, {static_cast<std::int64_t>(values.size())});
  dataset.write_rows(0, static_cast<std::int64_t>(values.size()), hdf5::DType::kInt64,
                     values.data());
}

// memory_model/points [n, 4] and memory_model/ranks [W, 3], float64 (see Checkpoint).
void write_memory_models(hdf5::File& file, const std::vector<Checkpoint::MemoryModelRecord>& m) {
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
  const auto world = static_cast<std::int64_t>(m.size());
  file.create_dataset("memory_model/ranks", hdf5::DType::kFloat64, {world, 3})
      .write_rows(0, world, hdf5::DType::kFloat64, ranks.data());
}

std::vector<Checkpoint::MemoryModelRecord> read_memory_models(hdf5::File& file) {
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

std::vector<std::int64_t> read_integers(hdf5::File& file, const std::string& name) {
  std::vector<std::int64_t> values;
  if (!file.has_dataset(name)) return values;
  auto dataset = file.dataset(name);
  values.resize(static_cast<std::size_t>(dataset.shape().at(0)));
  if (!values.empty())
    dataset.read_rows(0, static_cast<std::int64_t>(values.size()), hdf5::DType::kInt64,
                      values.data());
  return values;
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

void write_optimizer(hdf5::File& file, const Checkpoint& c, std::int64_t size) {
  auto state = file.create_dataset("optimizer/state", hdf5::DType::kUInt8, {size});
  if (!c.stream_optimizer) {
    if (size > 0) state.write_rows(0, size, hdf5::DType::kUInt8, c.optimizer.data());
    return;
  }
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
        if (count > 0) state.write_rows(at, count, hdf5::DType::kUInt8, data);
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
}

// An upper bound of the file's size: its data, and what HDF5 adds (measured: about 8 KiB, 220
// bytes per dataset for 400 datasets, 1.1 KiB per dataset for 12; here 8 KiB + 1 KiB per
// dataset + the attributes' bytes twice).
std::int64_t size_bound(const Checkpoint& c, std::int64_t optimizer_bytes) {
  std::int64_t data = optimizer_bytes;
  std::int64_t datasets = 9;  // optimizer/state, the 4 integer lists, the memory models, spare
  std::int64_t names = 0;
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
  return data + 8192 + 1024 * datasets + 2 * attributes;
}

}  // namespace

std::string previous_checkpoint_path(const std::string& path) {
  return path + ".prev";
}

std::int64_t write_checkpoint(const std::string& path, const Checkpoint& c) {
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
      write_tensor(file, "params/" + name, tensor);
      param_names.push_back(name);
    }
    for (const auto& [name, tensor] : c.buffers) {
      write_tensor(file, "buffers/" + name, tensor);
      buffer_names.push_back(name);
    }
    write_optimizer(file, c, optimizer_bytes);
    for (std::size_t r = 0; r < c.generator_states.size(); ++r) {
      const std::string& state = c.generator_states[r];
      auto dataset = file.create_dataset("rng/rank" + std::to_string(r), hdf5::DType::kUInt8,
                                         {static_cast<std::int64_t>(state.size())});
      if (!state.empty())
        dataset.write_rows(0, static_cast<std::int64_t>(state.size()), hdf5::DType::kUInt8,
                           state.data());
    }
    file.write_attribute("rng_ranks", static_cast<std::int64_t>(c.generator_states.size()));
    write_integers(file, "micro_batches", c.micro_batches);
    write_integers(file, "shares", c.shares);
    write_integers(file, "shares_after", c.shares_after);
    write_integers(file, "shares_followed", c.shares_followed);
    write_memory_models(file, c.memory_models);
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
    file.close();
    written = release_reserve(temporary);
    // The new one is complete: keep the current one as the previous before it is replaced. A
    // hard link gives the previous name while `path` keeps its own, so at every moment `path`
    // names a whole checkpoint (a kill between two renames used to leave only the previous).
    // Where the file system has no hard links, the current one is renamed instead.
    const std::string previous = previous_checkpoint_path(path);
    if (access(path.c_str(), F_OK) == 0) {
      const std::string staged = path + ".tmp.prev." + std::to_string(::getpid());
      std::remove(staged.c_str());
      const bool linked = ::link(path.c_str(), staged.c_str()) == 0;
      if (linked ? std::rename(staged.c_str(), previous.c_str()) != 0
                 : std::rename(path.c_str(), previous.c_str()) != 0) {
        if (linked) std::remove(staged.c_str());
        throw InputError("cannot keep the previous checkpoint as '" + previous + "'");
      }
    }
  });
  return written;
}

std::optional<LoadedCheckpoint> read_latest_checkpoint(const std::string& path) {
  const std::string previous = previous_checkpoint_path(path);
  const bool have_newest = access(path.c_str(), F_OK) == 0;
  const bool have_previous = access(previous.c_str(), F_OK) == 0;
  if (!have_newest && !have_previous) return std::nullopt;
  std::string problem;
  // Any failure to read one falls back to the other: HDF5's, LibTorch's (a tensor it cannot
  // make), or memory running out while reading.
  if (have_newest) {
    try {
      return LoadedCheckpoint{read_checkpoint(path), path, ""};
    } catch (const std::exception& e) {
      problem = e.what();
    }
    if (!have_previous)
      throw InputError("--resume: " + problem + " (and there is no previous checkpoint)");
  }
  try {
    return LoadedCheckpoint{
        read_checkpoint(previous), previous,
        have_newest ? "the newest checkpoint is unreadable (" + problem +
                          "); resuming from the previous one, " + previous
                    : "no " + path + " (a crash between two renames?); resuming from " + previous};
  } catch (const std::exception& e) {
    throw InputError("--resume: neither checkpoint is readable: " + problem + "; " + e.what());
  }
}

Checkpoint read_checkpoint(const std::string& path) {
  auto file = hdf5::File::open(path);
  if (!file.has_attribute("format") || file.read_string_attribute("format") != kFormat) {
    throw InputError("'" + path + "' is not an autoaccum checkpoint");
  }
  Checkpoint c;
  c.step = file.read_int_attribute("step");
  c.epoch = file.read_int_attribute("epoch");
  c.micro_batch = file.read_int_attribute("micro_batch");
  c.micro_batches = read_integers(file, "micro_batches");
  c.shares = read_integers(file, "shares");
  c.shares_after = read_integers(file, "shares_after");
  c.shares_followed = read_integers(file, "shares_followed");
  c.memory_models = read_memory_models(file);
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
    c.params.emplace_back(name, read_tensor(file, "params/" + name));
  }
  for (const auto& name : names_under(file, "buffers")) {
    c.buffers.emplace_back(name, read_tensor(file, "buffers/" + name));
  }
  const std::int64_t rng_ranks =
      file.has_attribute("rng_ranks") ? file.read_int_attribute("rng_ranks") : 0;
  for (std::int64_t r = 0; r < rng_ranks; ++r) {
    auto dataset = file.dataset("rng/rank" + std::to_string(r));
    std::string bytes(static_cast<std::size_t>(dataset.shape().at(0)), '\0');
    if (!bytes.empty())
      dataset.read_rows(0, static_cast<std::int64_t>(bytes.size()), hdf5::DType::kUInt8,
                        bytes.data());
    c.generator_states.push_back(std::move(bytes));
  }
  auto state = file.dataset("optimizer/state");
  c.optimizer.resize(static_cast<std::size_t>(state.shape().at(0)));
  if (!c.optimizer.empty()) {
    state.read_rows(0, static_cast<std::int64_t>(c.optimizer.size()), hdf5::DType::kUInt8,
                    c.optimizer.data());
  }
  return c;
}

}  // namespace autoaccum::io
