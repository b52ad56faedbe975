// SlabReader: schema checks across shards, and slab reads straight into tensor memory.
#include "autoaccum/data/slab_reader.hpp"

#include <ATen/ATen.h>
#include <glob.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "autoaccum/core/error.hpp"
#include "autoaccum/hdf5/hdf5.hpp"
#include "shard.hpp"

namespace autoaccum::data {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

namespace {

at::ScalarType tensor_type(FieldType type) {
  switch (type) {
    case FieldType::kUInt8:
      return at::kFloat;  // scaled to [0, 1]
    case FieldType::kInt64:
      return at::kLong;
    case FieldType::kFloat32:
      return at::kFloat;
  }
  return at::kFloat;
}

hdf5::DType file_type(FieldType type) {
  switch (type) {
    case FieldType::kUInt8:
      return hdf5::DType::kUInt8;
    case FieldType::kInt64:
      return hdf5::DType::kInt64;
    case FieldType::kFloat32:
      return hdf5::DType::kFloat32;
  }
  return hdf5::DType::kFloat32;
}

}  // namespace

std::string to_string(FieldType type) {
  return hdf5::to_string(file_type(type));
}

std::string DataSchema::describe() const {
  std::ostringstream out;
  if (documents) {
    out << describe_documents() << "\n";
    for (const auto& f : fields) {
      out << f.name << " " << f.stored_type;
      if (f.is_target) {
        out << (f.row_shape.empty()      ? " (target: one label per document)"
                : f.name == "next token" ? " (target: the next token of each document)"
                                         : " (target: one label per token)");
      } else if (f.name == "lengths") {
        out << " (input: each document's length, int64 [rows])";
      } else {
        out << " (input: token ids, int64 [rows, longest] padded on the right per micro-batch)";
      }
      out << "\n";
    }
    if (num_classes) out << "classes " << *num_classes << "\n";
    return out.str();
  }
  for (const auto& f : fields) {
    std::vector<std::int64_t> shape{rows};
    shape.insert(shape.end(), f.row_shape.begin(), f.row_shape.end());
    const std::string stored = f.stored_type.empty() ? to_string(f.type) : f.stored_type;
    out << f.name << " " << stored << " " << shape_text(shape);
    if (f.is_target) {
      out << " (target)";
    } else if (f.type == FieldType::kUInt8) {
      out << " (input: image, scaled to float32 in [0, 1])";
    } else if (f.type == FieldType::kInt64) {
      out << " (input: integer ids, passed unscaled as int64)";
    } else {
      out << " (input: float32 as stored)";
    }
    out << "\n";
  }
  if (num_classes) out << "classes " << *num_classes << "\n";
  return out.str();
}

std::vector<std::string> expand_data_paths(const std::vector<std::string>& arguments,
                                           const std::string& option) {
  std::vector<std::string> paths;
  for (const auto& argument : arguments) {
    if (argument.find_first_of("*?[") == std::string::npos) {
      paths.push_back(argument);
      continue;
    }
    glob_t matches{};
    const int status = glob(argument.c_str(), 0, nullptr, &matches);
    if (status == 0) {
      for (std::size_t i = 0; i < matches.gl_pathc; ++i)
        paths.emplace_back(matches.gl_pathv[i]);
    }
    globfree(&matches);
    if (status != 0) throw InputError(option + ": '" + argument + "' matches no file");
  }
  if (paths.empty()) throw UsageError(option + ": no file given");
  return paths;
}

namespace {

// Reads exactly `bytes` at `offset`, or fails naming the file.
void pread_exactly(int descriptor, const std::string& path, char* out, std::int64_t bytes,
                   std::int64_t offset) {
  while (bytes > 0) {
    const ssize_t got = ::pread(descriptor, out, static_cast<std::size_t>(bytes), offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      throw InputError(
          "'" + path + "': read failed at byte " + std::to_string(offset) + ": " +
          (got == 0 ? std::string("unexpected end of file (truncated?)") : std::strerror(errno)));
    }
    out += got;
    offset += got;
    bytes -= got;
  }
}

}  // namespace

namespace {

// A dataset named twice in --inputs/--targets.
void refuse_repeated_names(const std::vector<std::string>& names) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    for (std::size_t j = i + 1; j < names.size(); ++j) {
      if (names[i] == names[j])
        throw UsageError("dataset '" + names[i] + "' is named twice in --inputs/--targets");
    }
  }
}

[[noreturn]] void no_such_dataset(const hdf5::File& file, const std::string& path,
                                  const std::string& name, bool is_target) {
  std::string known;
  for (const auto& n : file.dataset_names())
    known += (known.empty() ? "" : ", ") + n;
  throw InputError("'" + path + "' has no dataset '" + name + "'" +
                   (known.empty() ? " (it has no datasets)" : " (it has: " + known + ")") +
                   (is_target ? "; see --targets" : "; see --inputs"));
}

// How a dataset reaches the model, from its type and its `encoding` attribute.
FieldType field_type(const hdf5::Dataset& dataset, const std::string& path, const std::string& name,
                     bool is_target) {
  // How integer inputs reach the model: uint8 is an image scaled to [0, 1] unless the
  // dataset says encoding = "integer" (byte-sized token ids, passed unscaled as int64).
  const std::optional<std::string> encoding = dataset.string_attribute("encoding");
  if (encoding && *encoding != "integer" && *encoding != "scaled") {
    throw InputError(where(path, name) + " has encoding '" + *encoding +
                     "'; it must be 'integer' (ids passed as int64) or 'scaled' (uint8 "
                     "images, x / 255)");
  }
  const bool integers =
      dataset.dtype() == hdf5::DType::kInt64 || dataset.dtype() == hdf5::DType::kInt32;
  if (encoding && dataset.dtype() != hdf5::DType::kUInt8 && !(integers && *encoding == "integer")) {
    throw InputError(where(path, name) + " is " + dataset.dtype_name() + " with encoding '" +
                     *encoding + "'; only uint8 data can be 'scaled' or 'integer' (" +
                     dataset.dtype_name() + " is always passed as " +
                     (dataset.dtype() == hdf5::DType::kFloat32 ? "float32" : "int64") + ")");
  }
  switch (dataset.dtype()) {
    case hdf5::DType::kUInt8:
      if (is_target)
        throw InputError(where(path, name) +
                         " is uint8; targets must be int64 class labels or float32 values");
      // Token ids are read as int64: HDF5 converts, the fast path steps aside.
      return encoding == std::optional<std::string>("integer") ? FieldType::kInt64
                                                               : FieldType::kUInt8;
    case hdf5::DType::kInt64:
    case hdf5::DType::kInt32:    // read as int64: HDF5 converts, the fast path steps aside
      return FieldType::kInt64;  // inputs: token ids, passed to the model unscaled
    case hdf5::DType::kFloat32:
      return FieldType::kFloat32;
    default:
      throw InputError(where(path, name) + " has unsupported type " + dataset.dtype_name() +
                       (is_target ? "; targets must be int64 or float32"
                                  : "; inputs must be uint8, int32, int64 or float32"));
  }
}

}  // namespace

SlabReader::~SlabReader() = default;
SlabReader::SlabReader(SlabReader&&) noexcept = default;
SlabReader& SlabReader::operator=(SlabReader&&) noexcept = default;

SlabReader::SlabReader(std::vector<std::string> paths, std::vector<std::string> inputs,
                       std::string target, bool check_labels, std::int64_t ignore_label)
    : paths_(std::move(paths)) {
  if (paths_.empty()) throw UsageError("--data: no training file given");
  if (inputs.empty()) throw UsageError("--inputs: no input dataset named");
  std::vector<std::string> names = inputs;
  names.push_back(target);
  refuse_repeated_names(names);
  {
    const hdf5::File first = hdf5::File::open(paths_.front());
    if (first.has_dataset("tokens") && first.has_dataset("offsets")) {
      open_documents(std::move(inputs), std::move(target), check_labels, ignore_label);
      return;
    }
  }
  DeclaredClasses declared;
  for (const auto& path : paths_)
    open_shard(path, names, declared);
  if (schema_.rows == 0) {
    throw InputError(paths_.size() == 1
                         ? "'" + paths_.front() + "': dataset '" + names[0] + "' has no rows"
                         : "the training data has no rows in any of its " +
                               std::to_string(paths_.size()) + " files");
  }

  if (schema_.target().type != FieldType::kInt64) return;
  const bool read_labels = check_labels || !declared.classes;
  const std::int64_t max_label =
      read_labels ? largest_label(target, declared.classes, ignore_label) : -1;
  schema_.num_classes = declared.classes ? *declared.classes : max_label + 1;
  if (read_labels) schema_.max_label = max_label;
}

// One shard of rows: its datasets checked against the names and against the first shard, its
// num_classes against the others', and the raw offsets of those the fast path may read directly.
void SlabReader::open_shard(const std::string& path, const std::vector<std::string>& names,
                            DeclaredClasses& declared) {
  std::unique_ptr<Shard> shard(new Shard{hdf5::File::open(path), {}, 0, {}, -1, {}});
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const bool is_target = i + 1 == names.size();
    if (!shard->file.has_dataset(name)) no_such_dataset(shard->file, path, name, is_target);
    hdf5::Dataset dataset = shard->file.dataset(name);
    const auto shape = dataset.shape();
    if (shape.empty())
      throw InputError(where(path, name) + " is a scalar; it needs a row dimension");
    const FieldType type = field_type(dataset, path, name, is_target);
    FieldSpec spec{name, type, std::vector<std::int64_t>(shape.begin() + 1, shape.end()), is_target,
                   dataset.dtype_name()};
    if (shard->datasets.empty()) {
      shard->rows = shape[0];
    } else if (shape[0] != shard->rows) {
      throw InputError("'" + path + "': dataset '" + names[0] + "' has " +
                       std::to_string(shard->rows) + " rows but '" + name + "' has " +
                       std::to_string(shape[0]));
    }
    if (schema_.fields.size() < names.size()) {
      schema_.fields.push_back(spec);
    } else {
      const FieldSpec& first = schema_.fields[i];
      if (first.type != spec.type || first.row_shape != spec.row_shape) {
        throw InputError(where(path, name) + " is " + to_string(spec.type) + " " +
                         shape_text(spec.row_shape) + " per row but in '" + paths_.front() +
                         "' it is " + to_string(first.type) + " " + shape_text(first.row_shape) +
                         ": shards must agree");
      }
    }
    shard->datasets.push_back(std::move(dataset));
  }
  if (schema_.target().type == FieldType::kInt64)
    read_declared_classes(shard->file, path, declared);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto offset = shard->datasets[i].raw_offset(file_type(schema_.fields[i].type));
    shard->raw_offsets.push_back(offset ? *offset : -1);
    if (offset && shard->descriptor < 0)
      shard->descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (shard->descriptor < 0) std::fill(shard->raw_offsets.begin(), shard->raw_offsets.end(), -1);
  shard_first_row_.push_back(schema_.rows);
  schema_.rows += shard->rows;
  shards_.push_back(std::move(shard));
}

// Labels outside [0, num_classes) would index past the logits; check them all once, up front.
// [rows] labels one class per row; [rows, T] one per token. `ignore_label` marks positions the
// loss skips (padding). Returns the largest label (-1: none).
std::int64_t SlabReader::largest_label(const std::string& target,
                                       std::optional<std::int64_t> declared_classes,
                                       std::int64_t ignore_label) const {
  std::int64_t per_row = 1;
  for (auto d : schema_.target().row_shape)
    per_row *= d;
  std::int64_t max_label = -1;
  const std::int64_t block = std::max<std::int64_t>(1, (1 << 20) / per_row);
  std::vector<std::int64_t> labels;
  for (std::size_t s = 0; s < shards_.size(); ++s) {
    for (std::int64_t first = 0; first < shards_[s]->rows; first += block) {
      const std::int64_t count = std::min(block, shards_[s]->rows - first);
      labels.resize(static_cast<std::size_t>(count * per_row));
      shards_[s]->datasets.back().read_rows(first, count, hdf5::DType::kInt64, labels.data());
      for (std::int64_t k = 0; k < count * per_row; ++k) {
        const std::int64_t label = labels[static_cast<std::size_t>(k)];
        if (label == ignore_label) continue;
        if (label < 0 || (declared_classes && label >= *declared_classes)) {
          throw InputError(where(paths_[s], target) + ": label " + std::to_string(label) +
                           " at row " + std::to_string(first + k / per_row) + " is outside [0, " +
                           (declared_classes ? std::to_string(*declared_classes) + ") (num_classes)"
                                             : std::string("inf)")));
        }
        max_label = std::max(max_label, label);
      }
    }
  }
  return max_label;
}

std::vector<std::int64_t> SlabReader::shard_rows() const {
  std::vector<std::int64_t> rows;
  for (std::size_t s = 0; s < shard_first_row_.size(); ++s)
    rows.push_back((s + 1 < shard_first_row_.size() ? shard_first_row_[s + 1] : schema_.rows) -
                   shard_first_row_[s]);
  return rows;
}

std::vector<std::string> SlabReader::compressed_datasets() const {
  std::vector<std::string> found;
  for (std::size_t s = 0; s < shards_.size(); ++s) {
    for (std::size_t i = 0; i < shards_[s]->datasets.size(); ++i) {
      const hdf5::Dataset& dataset = shards_[s]->datasets[i];
      if (!dataset.filtered()) continue;
      const std::int64_t chunk = dataset.chunk_rows();
      found.push_back("'" + dataset.name() + "' in " + paths_[s] + " (chunks of " +
                      std::to_string(chunk) + (chunk == 1 ? " row)" : " rows)"));
    }
  }
  return found;
}

Batch SlabReader::read(std::int64_t begin, std::int64_t end) const {
  if (begin < 0 || end > schema_.rows || begin > end) {
    throw Error("SlabReader::read: rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") outside the " + std::to_string(schema_.rows) + " rows of the training data");
  }
  if (schema_.documents) return read_documents(begin, end);
  const std::int64_t rows = end - begin;
  Batch batch;
  batch.first_row = begin;
  // Shards touched: the last shard whose first row is <= begin, onwards.
  const auto first_shard = static_cast<std::size_t>(
      std::upper_bound(shard_first_row_.begin(), shard_first_row_.end(), begin) -
      shard_first_row_.begin() - 1);
  std::vector<std::uint8_t> raw;
  for (std::size_t f = 0; f < schema_.fields.size(); ++f) {
    const FieldSpec& field = schema_.fields[f];
    std::vector<std::int64_t> shape{rows};
    shape.insert(shape.end(), field.row_shape.begin(), field.row_shape.end());
    at::Tensor tensor =
        at::empty(shape, at::TensorOptions().dtype(tensor_type(field.type)).pinned_memory(pinned_));
    std::int64_t per_row = 1;
    for (auto d : field.row_shape)
      per_row *= d;
    if (field.type == FieldType::kUInt8) raw.resize(static_cast<std::size_t>(rows * per_row));

    std::int64_t done = 0;
    for (std::size_t s = first_shard; done < rows && s < shards_.size(); ++s) {
      const std::int64_t local_first = begin + done - shard_first_row_[s];
      const std::int64_t count = std::min(rows - done, shards_[s]->rows - local_first);
      if (count <= 0) continue;
      const Shard& shard = *shards_[s];
      const std::int64_t element =
          field.type == FieldType::kUInt8 ? 1 : static_cast<std::int64_t>(tensor.element_size());
      char* out = field.type == FieldType::kUInt8
                      ? reinterpret_cast<char*>(raw.data()) + done * per_row
                      : static_cast<char*>(tensor.data_ptr()) + done * per_row * element;
      if (shard.raw_offsets[f] >= 0) {
        pread_exactly(shard.descriptor, paths_[s], out, count * per_row * element,
                      shard.raw_offsets[f] + local_first * per_row * element);
      } else {
        shard.datasets[f].read_rows(local_first, count, file_type(field.type), out);
      }
      done += count;
    }
    if (field.type == FieldType::kUInt8) {
      // A plain loop rather than ATen: this may run on the prefetch thread, where ATen's
      // OpenMP parallelism would start a second thread team.
      float* out = tensor.data_ptr<float>();
      for (std::size_t i = 0; i < raw.size(); ++i)
        out[i] = static_cast<float>(raw[i]) / 255.0f;
    }
    batch.add(field.name, std::move(tensor));
  }
  return batch;
}

}  // namespace autoaccum::data
