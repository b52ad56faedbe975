// A small RAII layer over the HDF5 C API: handles, checked calls, typed errors naming the file.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "autoaccum/core/error.hpp"

namespace autoaccum::hdf5 {

// Any failed HDF5 call. The message names the file (and dataset, when there is one), what was
// being done, and HDF5's own innermost error description.
class Hdf5Error : public InputError {
 public:
  using InputError::InputError;
};

// Held around every HDF5 call of this module. It takes the one process-wide (recursive) lock on
// the HDF5 library, so the prefetch thread's slab reads and the main thread's run log,
// checkpoint and validation reads never enter HDF5 at once: a library built without
// --enable-threadsafe must not be, and a thread-safe one takes its own global lock anyway. And
// it silences HDF5's automatic error-stack printing while alive: the wrapper reports errors
// itself. (That setting is per thread in thread-safe HDF5, so each call site sets it.)
class ErrorSilencer {
 public:
  ErrorSilencer();
  ~ErrorSilencer();
  ErrorSilencer(const ErrorSilencer&) = delete;
  ErrorSilencer& operator=(const ErrorSilencer&) = delete;

 private:
  std::unique_lock<std::recursive_mutex> lock_;  // first: taken before, released after the rest
  H5E_auto2_t function_ = nullptr;
  void* data_ = nullptr;
};

// The innermost message on this thread's HDF5 error stack ("" when empty).
std::string last_error_message();

// A reference-counted hid_t: copies share the identifier (H5Iinc_ref), moves null the source,
// and the last owner closes it. Never throws from the destructor.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}  // takes ownership of one reference
  Handle(const Handle& other);
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle other) noexcept {
    std::swap(id_, other.id_);
    return *this;
  }
  ~Handle();

  hid_t id() const noexcept { return id_; }
  bool valid() const noexcept { return id_ >= 0; }
  // Gives up ownership without closing (the caller closes).
  hid_t release() noexcept { return std::exchange(id_, H5I_INVALID_HID); }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Element types autoaccum reads and writes.
enum class DType { kUInt8, kInt64, kFloat32, kFloat64, kInt32, kUInt16, kOther };
std::string to_string(DType type);
hid_t native_type(DType type);  // H5T_NATIVE_* for kUInt8..kFloat64

class Dataset;

// An attribute's value as autoaccum writes them: an integer, a float, a string, or strings.
using AttributeValue = std::variant<std::int64_t, double, std::string, std::vector<std::string>>;

class File {
 public:
  // Opens an existing file. Read-only unless `writable`. A missing, unreadable, or non-HDF5 file
  // is an Hdf5Error naming it.
  // `lock = false` skips HDF5's file lock, so a writer is not refused while a reader (h5py,
  // `autoaccum log`) has the file open; used for the run log, whose writer is the only one.
  static File open(const std::string& path, bool writable = false, bool lock = true);
  // Creates (truncates) a file.
  static File create(const std::string& path);
  // Creates a file that lives in memory only (HDF5's core driver, no backing store); `name` is
  // for messages. close_to_image() ends it and returns its bytes, which the caller writes itself:
  // HDF5 then never meets a failing disk (HDF5 1.14 can crash closing a file whose writes failed
  // on a full disk), and the file reaches the disk as one sequential write.
  static File create_in_memory(const std::string& name);

  const std::string& path() const noexcept { return path_; }
  hid_t id() const noexcept { return handle_.id(); }

  bool has_dataset(const std::string& name) const;
  Dataset dataset(const std::string& name) const;
  // Names of the datasets in the root group, in name order.
  std::vector<std::string> dataset_names() const;

  // A 1-D dataset of fixed-length strings (h5py reads bytes), replacing any dataset of that name.
  void write_strings(const std::string& name, const std::vector<std::string>& values);
  std::vector<std::string> read_strings(const std::string& name) const;

  // Creates a dataset (intermediate groups too, e.g. "steps/loss") of `type` with the given shape;
  // dimension 0 is extendible (unlimited) when `extendible`, and chunked by `chunk_rows` rows (0:
  // contiguous layout, fixed size only).
  Dataset create_dataset(const std::string& name, DType type,
                         const std::vector<std::int64_t>& shape, std::int64_t chunk_rows = 0,
                         bool extendible = false);

  // Root attributes.
  bool has_attribute(const std::string& name) const;
  std::int64_t read_int_attribute(const std::string& name) const;
  std::string read_string_attribute(const std::string& name) const;
  std::vector<std::string> read_string_list_attribute(const std::string& name) const;
  void write_attribute(const std::string& name, std::int64_t value);
  void write_attribute(const std::string& name, double value);
  void write_attribute(const std::string& name, const std::string& value);
  void write_attribute(const std::string& name, const std::vector<std::string>& values);
  std::vector<std::string> attribute_names() const;
  // Any root attribute of the four kinds above (integers and floats as scalars; a string array
  // of one element stays an array); another type or shape is an Hdf5Error naming it.
  AttributeValue attribute_value(const std::string& name) const;
  void write_attribute(const std::string& name, const AttributeValue& value);
  // A printable rendering of any root attribute (numbers, strings, arrays of either).
  std::string describe_attribute(const std::string& name) const;

  void flush();
  // Closes now and reports a failure (a full disk shows here); the destructor would hide it.
  // No dataset of this file may be alive.
  void close();
  // For a file from create_in_memory(): its complete bytes, as a file on disk would hold them;
  // closes it. No dataset of this file may be alive.
  std::vector<char> close_to_image();

 private:
  File(std::string path, Handle handle) : path_(std::move(path)), handle_(std::move(handle)) {}
  std::string path_;
  Handle handle_;
};

class Dataset {
 public:
  Dataset(std::string file, std::string name, Handle handle);

  const std::string& name() const noexcept { return name_; }
  const std::string& file() const noexcept { return file_; }
  std::vector<std::int64_t> shape() const;
  DType dtype() const;
  // "uint8", "int64", ... or HDF5's class for others ("string", "compound", "int16", ...).
  std::string dtype_name() const;
  // Row chunking (0 when contiguous) and whether any filter (compression) is set.
  std::int64_t chunk_rows() const;
  bool filtered() const;

  // The byte offset of the data in the file when it can be read with plain pread(2): contiguous
  // layout, allocated, no filters, no external storage, and stored exactly as `type` is in
  // memory (same size and byte order). Otherwise nothing.
  std::optional<std::int64_t> raw_offset(DType type) const;

  // Reads rows [first, first + rows) of the whole trailing shape into `out` (`type` is the
  // memory element type; HDF5 converts from the file's type when they differ).
  void read_rows(std::int64_t first, std::int64_t rows, DType type, void* out) const;
  // Writes rows [first, first + rows); for an extendible dataset, grows it first when needed.
  void write_rows(std::int64_t first, std::int64_t rows, DType type, const void* data);

  // A string attribute of the dataset, or nothing when it has none of that name.
  std::optional<std::string> string_attribute(const std::string& name) const;
  void write_attribute(const std::string& name, const std::string& value);

 private:
  std::string context(const std::string& what) const;
  std::string file_;
  std::string name_;
  Handle handle_;
};

}  // namespace autoaccum::hdf5
