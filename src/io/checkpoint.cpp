// Checkpoint I/O through the HDF5 layer.
#include "autoaccum/io/checkpoint.hpp"

#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdio>

#include "autoaccum/core/atomic_write.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/hdf5/hdf5.hpp"

namespace autoaccum::io {
namespace {

constexpr const char* kFormat = "autoaccum.checkpoint";

hdf5::DType dtype_of(const at::Tensor& t, const std::string& name) {
  switch (t.scalar_type()) {
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

// Types HDF5 files here do not hold are stored widened (bool as uint8, other integers as int64,
// half precisions as float32); loading copies them back into the model's own type.
at::Tensor storable(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kLong:
    case at::kByte:
      return tensor;
    case at::kBool:
      return tensor.to(at::kByte);
    case at::kHalf:
    case at::kBFloat16:
      return tensor.to(at::kFloat);
    default:
      return at::isIntegralType(tensor.scalar_type(), false) ? tensor.to(at::kLong) : tensor;
  }
}

void write_tensor(hdf5::File& file, const std::string& name, const at::Tensor& tensor) {
  const at::Tensor t = storable(tensor.detach().contiguous().cpu());
  std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
  if (shape.empty()) shape = {1};
  const auto type = dtype_of(t, name);
  auto dataset = file.create_dataset(name, type, shape);
  if (t.numel() > 0) dataset.write_rows(0, shape[0], type, t.data_ptr());
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

}  // namespace

std::string previous_checkpoint_path(const std::string& path) {
  return path + ".prev";
}

void write_checkpoint(const std::string& path, const Checkpoint& c) {
  write_atomically(path, [&](const std::string& temporary) {
    // Made in memory and written in one piece: see hdf5::File::create_in_memory.
    auto file = hdf5::File::create_in_memory(temporary);
    std::vector<std::string> param_names, buffer_names;
    for (const auto& [name, tensor] : c.params) {
      write_tensor(file, "params/" + name, tensor);
      param_names.push_back(name);
    }
    for (const auto& [name, tensor] : c.buffers) {
      write_tensor(file, "buffers/" + name, tensor);
      buffer_names.push_back(name);
    }
    {
      auto state = file.create_dataset("optimizer/state", hdf5::DType::kUInt8,
                                       {static_cast<std::int64_t>(c.optimizer.size())});
      state.write_rows(0, static_cast<std::int64_t>(c.optimizer.size()), hdf5::DType::kUInt8,
                       c.optimizer.data());
    }
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
    const std::vector<char> image = file.close_to_image();
    write_file(temporary, image.data(), image.size());
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
