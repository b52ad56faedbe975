// HDF5 RAII layer: every C call checked, every failure an Hdf5Error that names file and dataset.
#include "autoaccum/hdf5/hdf5.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

namespace autoaccum::hdf5 {
namespace {

// Collects the innermost (first pushed) description of the error stack.
herr_t innermost(unsigned n, const H5E_error2_t* error, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && error && error->desc) *out = error->desc;
  return 0;
}

[[noreturn]] void fail(const std::string& context) {
  std::string detail = last_error_message();
  // System errors come as "... errno = 28, error message = 'No space left on device', ...".
  const auto start = detail.find("error message = '");
  if (start != std::string::npos) {
    const auto end = detail.find('\'', start + 17);
    detail =
        detail.substr(start + 17, end == std::string::npos ? std::string::npos : end - start - 17);
  }
  throw Hdf5Error(detail.empty() ? context : context + " (" + detail + ")");
}

template <class T>
T check(T result, const std::string& context) {
  if (result < 0) fail(context);
  return result;
}

std::string quoted(const std::string& path) {
  return "'" + path + "'";
}

// A clearer reason than HDF5's for the common ways opening a file fails.
std::string why_cannot_open(const std::string& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) return std::strerror(errno);
  if (S_ISDIR(info.st_mode)) return "it is a directory";
  if (access(path.c_str(), R_OK) != 0) return "no read permission";
  if (H5Fis_hdf5(path.c_str()) <= 0) return "not an HDF5 file (or truncated)";
  return "";
}

}  // namespace

namespace {
std::recursive_mutex& library_lock() {
  static std::recursive_mutex lock;
  return lock;
}
}  // namespace

ErrorSilencer::ErrorSilencer() : lock_(library_lock()) {
  H5Eget_auto2(H5E_DEFAULT, &function_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

ErrorSilencer::~ErrorSilencer() {
  H5Eset_auto2(H5E_DEFAULT, function_, data_);
}

std::string last_error_message() {
  std::string message;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &message);
  return message;
}

Handle::Handle(const Handle& other) : id_(other.id_) {
  if (id_ >= 0) {
    ErrorSilencer quiet;
    H5Iinc_ref(id_);
  }
}

Handle::~Handle() {
  if (id_ >= 0) {
    ErrorSilencer quiet;
    H5Idec_ref(id_);
  }
}

std::string to_string(DType type) {
  switch (type) {
    case DType::kUInt8:
      return "uint8";
    case DType::kInt64:
      return "int64";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kOther:
      return "other";
  }
  return "other";
}

hid_t native_type(DType type) {
  switch (type) {
    case DType::kUInt8:
      return H5T_NATIVE_UINT8;
    case DType::kInt64:
      return H5T_NATIVE_INT64;
    case DType::kFloat32:
      return H5T_NATIVE_FLOAT;
    case DType::kFloat64:
      return H5T_NATIVE_DOUBLE;
    case DType::kInt32:
      return H5T_NATIVE_INT32;
    case DType::kOther:
      break;
  }
  throw Error("hdf5::native_type: no native type for 'other'");
}

// ---- File ----

File File::open(const std::string& path, bool writable, bool lock) {
  ErrorSilencer quiet;
  // Fail with our own reason first: HDF5's message for a directory or missing file is obscure.
  const std::string reason = why_cannot_open(path);
  if (!reason.empty()) throw Hdf5Error("cannot open " + quoted(path) + ": " + reason);
  Handle access(check(H5Pcreate(H5P_FILE_ACCESS), "cannot open " + quoted(path)));
  if (!lock) check(H5Pset_file_locking(access.id(), false, true), "cannot open " + quoted(path));
  const hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, access.id());
  if (id < 0 && last_error_message().find("unable to lock file") != std::string::npos) {
    throw Hdf5Error("cannot open " + quoted(path) +
                    ": another process has it open for writing and holds HDF5's file lock "
                    "(an h5py or HDF5 writer); close it there, or read it anyway with "
                    "HDF5_USE_FILE_LOCKING=FALSE in the environment");
  }
  if (id < 0) fail("cannot open " + quoted(path));
  return File(path, Handle(id));
}

File File::create(const std::string& path) {
  ErrorSilencer quiet;
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) fail("cannot create " + quoted(path));
  return File(path, Handle(id));
}

File File::create_in_memory(const std::string& name) {
  ErrorSilencer quiet;
  Handle access(check(H5Pcreate(H5P_FILE_ACCESS), "cannot create " + quoted(name)));
  // Grows in 16 MiB steps; nothing is written to disk (backing_store = false).
  check(H5Pset_fapl_core(access.id(), std::size_t{16} << 20, false),
        "cannot create " + quoted(name) + " in memory");
  const hid_t id = H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.id());
  if (id < 0) fail("cannot create " + quoted(name) + " in memory");
  return File(name, Handle(id));
}

std::vector<char> File::close_to_image() {
  ErrorSilencer quiet;
  check(H5Fflush(id(), H5F_SCOPE_LOCAL), "cannot finish " + quoted(path_));
  const ssize_t size = H5Fget_file_image(id(), nullptr, 0);
  if (size < 0) fail("cannot finish " + quoted(path_));
  std::vector<char> image(static_cast<std::size_t>(size));
  if (H5Fget_file_image(id(), image.data(), image.size()) != size)
    fail("cannot finish " + quoted(path_));
  close();
  return image;
}

namespace {

// Whether `name` in the root group is a dataset; portable across HDF5 1.10 and 1.12+ (whose
// H5Oget_info and H5Literate signatures differ), by opening the object and asking its type.
bool is_dataset(hid_t file, const char* name) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) return false;
  const hid_t object = H5Oopen(file, name, H5P_DEFAULT);
  if (object < 0) return false;
  const bool dataset = H5Iget_type(object) == H5I_DATASET;
  H5Oclose(object);
  return dataset;
}

}  // namespace

bool File::has_dataset(const std::string& name) const {
  ErrorSilencer quiet;
  return is_dataset(id(), name.c_str());
}

Dataset File::dataset(const std::string& name) const {
  ErrorSilencer quiet;
  if (!has_dataset(name)) {
    throw Hdf5Error(quoted(path_) + " has no dataset '" + name + "'");
  }
  const hid_t d = H5Dopen2(id(), name.c_str(), H5P_DEFAULT);
  if (d < 0) fail(quoted(path_) + ": cannot open dataset '" + name + "'");
  return Dataset(path_, name, Handle(d));
}

std::vector<std::string> File::dataset_names() const {
  ErrorSilencer quiet;
  H5G_info_t info{};
  check(H5Gget_info(id(), &info), "cannot list the datasets of " + quoted(path_));
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t length =
        H5Lget_name_by_idx(id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (length < 0) continue;
    std::string name(static_cast<std::size_t>(length), '\0');
    H5Lget_name_by_idx(id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size() + 1,
                       H5P_DEFAULT);
    if (is_dataset(id(), name.c_str())) names.push_back(name);
  }
  return names;
}

Dataset File::create_dataset(const std::string& name, DType type,
                             const std::vector<std::int64_t>& shape, std::int64_t chunk_rows,
                             bool extendible) {
  ErrorSilencer quiet;
  const std::string where = quoted(path_) + ": cannot create dataset '" + name + "'";
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  std::vector<hsize_t> max_dims = dims;
  if (extendible) {
    if (chunk_rows <= 0) throw Error(where + ": an extendible dataset needs chunk_rows > 0");
    max_dims[0] = H5S_UNLIMITED;
  }
  Handle space(
      check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max_dims.data()), where));
  Handle properties(check(H5Pcreate(H5P_DATASET_CREATE), where));
  Handle links(check(H5Pcreate(H5P_LINK_CREATE), where));
  check(H5Pset_create_intermediate_group(links.id(), 1), where);
  if (chunk_rows > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = static_cast<hsize_t>(chunk_rows);
    check(H5Pset_chunk(properties.id(), static_cast<int>(chunk.size()), chunk.data()), where);
  }
  const hid_t d = H5Dcreate2(id(), name.c_str(), native_type(type), space.id(), links.id(),
                             properties.id(), H5P_DEFAULT);
  if (d < 0) fail(where);
  return Dataset(path_, name, Handle(d));
}

void File::write_strings(const std::string& name, const std::vector<std::string>& values) {
  ErrorSilencer quiet;
  const std::string where = quoted(path_) + ": cannot write dataset '" + name + "'";
  std::size_t width = 1;
  for (const auto& v : values)
    width = std::max(width, v.size());
  std::vector<char> packed(width * values.size(), '\0');
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::copy(values[i].begin(), values[i].end(),
              packed.begin() + static_cast<std::ptrdiff_t>(i * width));
  }
  if (H5Lexists(id(), name.c_str(), H5P_DEFAULT) > 0)
    check(H5Ldelete(id(), name.c_str(), H5P_DEFAULT), where);
  Handle type(check(H5Tcopy(H5T_C_S1), where));
  check(H5Tset_size(type.id(), width), where);
  const hsize_t count = values.size();
  Handle space(check(H5Screate_simple(1, &count, nullptr), where));
  Handle links(check(H5Pcreate(H5P_LINK_CREATE), where));
  check(H5Pset_create_intermediate_group(links.id(), 1), where);
  Handle dataset(check(
      H5Dcreate2(id(), name.c_str(), type.id(), space.id(), links.id(), H5P_DEFAULT, H5P_DEFAULT),
      where));
  if (count > 0)
    check(H5Dwrite(dataset.id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, packed.data()), where);
}

std::vector<std::string> File::read_strings(const std::string& name) const {
  ErrorSilencer quiet;
  const std::string where = quoted(path_) + ": cannot read dataset '" + name + "'";
  Handle dataset(check(H5Dopen2(id(), name.c_str(), H5P_DEFAULT), where));
  Handle type(check(H5Dget_type(dataset.id()), where));
  if (H5Tget_class(type.id()) != H5T_STRING || H5Tis_variable_str(type.id()) > 0) {
    throw Hdf5Error(where + ": not a fixed-length string dataset");
  }
  Handle space(check(H5Dget_space(dataset.id()), where));
  const auto count =
      static_cast<std::size_t>(check(H5Sget_simple_extent_npoints(space.id()), where));
  const std::size_t width = H5Tget_size(type.id());
  std::vector<char> packed(width * count + 1, '\0');
  if (count > 0)
    check(H5Dread(dataset.id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, packed.data()), where);
  std::vector<std::string> values;
  for (std::size_t i = 0; i < count; ++i) {
    const char* start = packed.data() + i * width;
    values.emplace_back(start, strnlen(start, width));
  }
  return values;
}

bool File::has_attribute(const std::string& name) const {
  ErrorSilencer quiet;
  return H5Aexists(id(), name.c_str()) > 0;
}

std::int64_t File::read_int_attribute(const std::string& name) const {
  ErrorSilencer quiet;
  const std::string where = quoted(path_) + ": attribute '" + name + "'";
  Handle attribute(check(H5Aopen(id(), name.c_str(), H5P_DEFAULT), where + " cannot be opened"));
  Handle type(check(H5Aget_type(attribute.id()), where));
  if (H5Tget_class(type.id()) != H5T_INTEGER) throw Hdf5Error(where + " is not an integer");
  Handle space(check(H5Aget_space(attribute.id()), where));
  if (H5Sget_simple_extent_npoints(space.id()) != 1) throw Hdf5Error(where + " is not a scalar");
  std::int64_t value = 0;
  check(H5Aread(attribute.id(), H5T_NATIVE_INT64, &value), where + " cannot be read");
  return value;
}

namespace {

std::vector<std::string> read_attribute_strings(hid_t attribute, const std::string& where) {
  Handle type(check(H5Aget_type(attribute), where));
  if (H5Tget_class(type.id()) != H5T_STRING) throw Hdf5Error(where + " is not a string");
  Handle space(check(H5Aget_space(attribute), where));
  const auto count =
      static_cast<std::size_t>(check(H5Sget_simple_extent_npoints(space.id()), where));
  std::vector<std::string> values;
  if (count == 0) return values;
  if (H5Tis_variable_str(type.id()) > 0) {
    Handle memory(check(H5Tcopy(H5T_C_S1), where));
    check(H5Tset_size(memory.id(), H5T_VARIABLE), where);
    check(H5Tset_cset(memory.id(), H5Tget_cset(type.id())), where);
    std::vector<char*> pointers(count, nullptr);
    check(H5Aread(attribute, memory.id(), pointers.data()), where + " cannot be read");
    for (char* p : pointers)
      values.emplace_back(p ? p : "");
    H5Dvlen_reclaim(memory.id(), space.id(), H5P_DEFAULT, pointers.data());
  } else {
    const std::size_t size = H5Tget_size(type.id());
    std::vector<char> buffer(size * count + 1, '\0');
    check(H5Aread(attribute, type.id(), buffer.data()), where + " cannot be read");
    for (std::size_t i = 0; i < count; ++i) {
      const char* start = buffer.data() + i * size;
      values.emplace_back(start, strnlen(start, size));
    }
  }
  return values;
}

void write_attribute_raw(hid_t file, const std::string& path, const std::string& name, hid_t type,
                         hid_t space, const void* data) {
  const std::string where = quoted(path) + ": cannot write attribute '" + name + "'";
  if (H5Aexists(file, name.c_str()) > 0) check(H5Adelete(file, name.c_str()), where);
  Handle attribute(
      check(H5Acreate2(file, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), where));
  check(H5Awrite(attribute.id(), type, data), where);
}

}  // namespace

std::string File::read_string_attribute(const std::string& name) const {
  ErrorSilencer quiet;
  const std::string where = quoted(path_) + ": attribute '" + name + "'";
  Handle attribute(check(H5Aopen(id(), name.c_str(), H5P_DEFAULT), where + " cannot be opened"));
  auto values = read_attribute_strings(attribute.id(), where);
  if (values.size() != 1) throw Hdf5Error(where + " is not a single string");
  return values.front();
}

std::vector<std::string> File::read_string_list_attribute(const std::string& name) const {
  ErrorSilencer quiet;
  const std::string where = quoted(path_) + ": attribute '" + name + "'";
  Handle attribute(check(H5Aopen(id(), name.c_str(), H5P_DEFAULT), where + " cannot be opened"));
  return read_attribute_strings(attribute.id(), where);
}

void File::write_attribute(const std::string& name, std::int64_t value) {
  ErrorSilencer quiet;
  Handle space(check(H5Screate(H5S_SCALAR), "H5Screate"));
  write_attribute_raw(id(), path_, name, H5T_NATIVE_INT64, space.id(), &value);
}

void File::write_attribute(const std::string& name, double value) {
  ErrorSilencer quiet;
  Handle space(check(H5Screate(H5S_SCALAR), "H5Screate"));
  write_attribute_raw(id(), path_, name, H5T_NATIVE_DOUBLE, space.id(), &value);
}

namespace {

void write_string_attribute(hid_t file, const std::string& path, const std::string& name,
                            const std::vector<std::string>& values, bool scalar) {
  ErrorSilencer quiet;
  const std::string where = quoted(path) + ": cannot write attribute '" + name + "'";
  // Variable-length UTF-8 strings: h5py reads them as str.
  Handle type(check(H5Tcopy(H5T_C_S1), where));
  check(H5Tset_size(type.id(), H5T_VARIABLE), where);
  check(H5Tset_cset(type.id(), H5T_CSET_UTF8), where);
  std::vector<const char*> pointers;
  for (const auto& v : values)
    pointers.push_back(v.c_str());
  const hsize_t count = values.size();
  Handle space(scalar ? check(H5Screate(H5S_SCALAR), where)
                      : check(H5Screate_simple(1, &count, nullptr), where));
  const char* none = "";
  write_attribute_raw(file, path, name, type.id(), space.id(),
                      pointers.empty() ? &none : pointers.data());
}

}  // namespace

void File::write_attribute(const std::string& name, const std::string& value) {
  write_string_attribute(id(), path_, name, {value}, /*scalar=*/true);
}

void File::write_attribute(const std::string& name, const std::vector<std::string>& values) {
  write_string_attribute(id(), path_, name, values, /*scalar=*/false);
}

AttributeValue File::attribute_value(const std::string& name) const {
  ErrorSilencer quiet;
  const std::string where = quoted(path_) + ": attribute '" + name + "'";
  Handle attribute(check(H5Aopen(id(), name.c_str(), H5P_DEFAULT), where + " cannot be opened"));
  Handle type(check(H5Aget_type(attribute.id()), where));
  Handle space(check(H5Aget_space(attribute.id()), where));
  const bool scalar = H5Sget_simple_extent_type(space.id()) == H5S_SCALAR;
  switch (H5Tget_class(type.id())) {
    case H5T_INTEGER:
      if (H5Sget_simple_extent_npoints(space.id()) == 1) return read_int_attribute(name);
      break;
    case H5T_FLOAT:
      if (H5Sget_simple_extent_npoints(space.id()) == 1) {
        double value = 0;
        check(H5Aread(attribute.id(), H5T_NATIVE_DOUBLE, &value), where + " cannot be read");
        return value;
      }
      break;
    case H5T_STRING: {
      auto values = read_attribute_strings(attribute.id(), where);
      if (scalar && values.size() == 1) return values.front();
      return values;
    }
    default:
      break;
  }
  throw Hdf5Error(where + " is not an integer, a float, a string or strings");
}

void File::write_attribute(const std::string& name, const AttributeValue& value) {
  std::visit([&](const auto& v) { write_attribute(name, v); }, value);
}

std::vector<std::string> File::attribute_names() const {
  ErrorSilencer quiet;
  std::vector<std::string> names;
  H5Aiterate2(
      id(), H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
        static_cast<std::vector<std::string>*>(data)->push_back(name);
        return 0;
      },
      &names);
  return names;
}

std::string File::describe_attribute(const std::string& name) const {
  ErrorSilencer quiet;
  const std::string where = quoted(path_) + ": attribute '" + name + "'";
  Handle attribute(check(H5Aopen(id(), name.c_str(), H5P_DEFAULT), where + " cannot be opened"));
  Handle type(check(H5Aget_type(attribute.id()), where));
  Handle space(check(H5Aget_space(attribute.id()), where));
  const auto count = static_cast<std::size_t>(H5Sget_simple_extent_npoints(space.id()));
  std::ostringstream out;
  auto list = [&](const auto& values) {
    if (values.size() != 1) out << "[";
    for (std::size_t i = 0; i < values.size(); ++i)
      out << (i ? ", " : "") << values[i];
    if (values.size() != 1) out << "]";
  };
  switch (H5Tget_class(type.id())) {
    case H5T_INTEGER: {
      std::vector<std::int64_t> values(count);
      check(H5Aread(attribute.id(), H5T_NATIVE_INT64, values.data()), where);
      list(values);
      break;
    }
    case H5T_FLOAT: {
      std::vector<double> values(count);
      check(H5Aread(attribute.id(), H5T_NATIVE_DOUBLE, values.data()), where);
      list(values);
      break;
    }
    case H5T_STRING:
      list(read_attribute_strings(attribute.id(), where));
      break;
    default:
      out << "(" << count << " value(s) of an unsupported type)";
  }
  return out.str();
}

void File::close() {
  ErrorSilencer quiet;
  if (!handle_.valid()) return;
  // With a dataset still open, H5Fclose would only defer the real close, and its errors (a full
  // disk) would be lost.
  const ssize_t open_objects = H5Fget_obj_count(
      handle_.id(), H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR);
  if (open_objects > 0) {
    throw Error("internal: closing " + quoted(path_) + " with " + std::to_string(open_objects) +
                " object(s) still open");
  }
  check(H5Fclose(handle_.release()), "cannot write " + quoted(path_));
}

void File::flush() {
  ErrorSilencer quiet;
  check(H5Fflush(id(), H5F_SCOPE_LOCAL), "cannot flush " + quoted(path_));
}

// ---- Dataset ----

Dataset::Dataset(std::string file, std::string name, Handle handle)
    : file_(std::move(file)), name_(std::move(name)), handle_(std::move(handle)) {}

std::string Dataset::context(const std::string& what) const {
  return "'" + file_ + "', dataset '" + name_ + "': " + what;
}

std::vector<std::int64_t> Dataset::shape() const {
  ErrorSilencer quiet;
  Handle space(check(H5Dget_space(handle_.id()), context("cannot read the shape")));
  const int rank = check(H5Sget_simple_extent_ndims(space.id()), context("cannot read the shape"));
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  check(H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr),
        context("cannot read the shape"));
  return std::vector<std::int64_t>(dims.begin(), dims.end());
}

DType Dataset::dtype() const {
  ErrorSilencer quiet;
  Handle type(check(H5Dget_type(handle_.id()), context("cannot read the type")));
  const H5T_class_t type_class = H5Tget_class(type.id());
  const std::size_t size = H5Tget_size(type.id());
  if (type_class == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type.id()) == H5T_SGN_2;
    if (!is_signed && size == 1) return DType::kUInt8;
    if (is_signed && size == 8) return DType::kInt64;
    if (is_signed && size == 4) return DType::kInt32;
  } else if (type_class == H5T_FLOAT) {
    if (size == 4) return DType::kFloat32;
    if (size == 8) return DType::kFloat64;
  }
  return DType::kOther;
}

std::string Dataset::dtype_name() const {
  const DType known = dtype();
  if (known != DType::kOther) return to_string(known);
  ErrorSilencer quiet;
  Handle type(check(H5Dget_type(handle_.id()), context("cannot read the type")));
  const std::size_t bits = H5Tget_size(type.id()) * 8;
  switch (H5Tget_class(type.id())) {
    case H5T_INTEGER:
      return (H5Tget_sign(type.id()) == H5T_SGN_2 ? "int" : "uint") + std::to_string(bits);
    case H5T_FLOAT:
      return "float" + std::to_string(bits);
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "variable-length";
    default:
      return "unsupported";
  }
}

std::int64_t Dataset::chunk_rows() const {
  ErrorSilencer quiet;
  Handle properties(check(H5Dget_create_plist(handle_.id()), context("cannot read the layout")));
  if (H5Pget_layout(properties.id()) != H5D_CHUNKED) return 0;
  std::vector<hsize_t> chunk(32);
  const int rank = H5Pget_chunk(properties.id(), static_cast<int>(chunk.size()), chunk.data());
  return rank > 0 ? static_cast<std::int64_t>(chunk[0]) : 0;
}

bool Dataset::filtered() const {
  ErrorSilencer quiet;
  Handle properties(check(H5Dget_create_plist(handle_.id()), context("cannot read the layout")));
  return H5Pget_nfilters(properties.id()) > 0;
}

std::optional<std::int64_t> Dataset::raw_offset(DType type) const {
  ErrorSilencer quiet;
  if (type == DType::kOther) return std::nullopt;
  Handle properties(H5Dget_create_plist(handle_.id()));
  if (!properties.valid() || H5Pget_layout(properties.id()) != H5D_CONTIGUOUS) return std::nullopt;
  if (H5Pget_nfilters(properties.id()) != 0 || H5Pget_external_count(properties.id()) != 0)
    return std::nullopt;
  Handle file_type(H5Dget_type(handle_.id()));
  if (!file_type.valid() || H5Tequal(file_type.id(), native_type(type)) <= 0) return std::nullopt;
  const haddr_t offset = H5Dget_offset(handle_.id());
  if (offset == HADDR_UNDEF) return std::nullopt;
  return static_cast<std::int64_t>(offset);
}

namespace {

// Selects rows [first, first + rows) of every trailing dimension in `file_space` (whose extent
// is `dims`) and returns the matching memory space.
Handle select_rows(hid_t file_space, const std::vector<hsize_t>& dims, std::int64_t first,
                   std::int64_t rows, const std::string& where) {
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  start[0] = static_cast<hsize_t>(first);
  count[0] = static_cast<hsize_t>(rows);
  check(
      H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
      where);
  return Handle(
      check(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), where));
}

std::vector<hsize_t> extent(hid_t space, const std::string& where) {
  std::vector<hsize_t> dims(
      static_cast<std::size_t>(check(H5Sget_simple_extent_ndims(space), where)));
  check(H5Sget_simple_extent_dims(space, dims.data(), nullptr), where);
  return dims;
}

}  // namespace

void Dataset::read_rows(std::int64_t first, std::int64_t rows, DType type, void* out) const {
  ErrorSilencer quiet;
  const std::string where = context("cannot read rows [" + std::to_string(first) + ", " +
                                    std::to_string(first + rows) + ")");
  if (rows == 0) return;
  Handle file_space(check(H5Dget_space(handle_.id()), where));
  const std::vector<hsize_t> dims = extent(file_space.id(), where);
  if (first < 0 || rows < 0 || static_cast<hsize_t>(first + rows) > dims[0]) {
    throw Hdf5Error(where + ": the dataset has " + std::to_string(dims[0]) + " rows");
  }
  Handle memory_space = select_rows(file_space.id(), dims, first, rows, where);
  check(H5Dread(handle_.id(), native_type(type), memory_space.id(), file_space.id(), H5P_DEFAULT,
                out),
        where);
}

void Dataset::write_rows(std::int64_t first, std::int64_t rows, DType type, const void* data) {
  ErrorSilencer quiet;
  const std::string where = context("cannot write rows [" + std::to_string(first) + ", " +
                                    std::to_string(first + rows) + ")");
  if (rows == 0) return;
  Handle space(check(H5Dget_space(handle_.id()), where));
  std::vector<hsize_t> dims = extent(space.id(), where);
  if (static_cast<hsize_t>(first + rows) > dims[0]) {  // an extendible dataset grows
    dims[0] = static_cast<hsize_t>(first + rows);
    check(H5Dset_extent(handle_.id(), dims.data()), where);
    space = Handle(check(H5Dget_space(handle_.id()), where));
  }
  Handle memory_space = select_rows(space.id(), dims, first, rows, where);
  check(H5Dwrite(handle_.id(), native_type(type), memory_space.id(), space.id(), H5P_DEFAULT, data),
        where);
}

std::optional<std::string> Dataset::string_attribute(const std::string& name) const {
  ErrorSilencer quiet;
  if (H5Aexists(handle_.id(), name.c_str()) <= 0) return std::nullopt;
  const std::string where = context("attribute '" + name + "'");
  Handle attribute(
      check(H5Aopen(handle_.id(), name.c_str(), H5P_DEFAULT), where + " cannot be opened"));
  auto values = read_attribute_strings(attribute.id(), where);
  if (values.size() != 1) throw Hdf5Error(where + " is not a single string");
  return values.front();
}

void Dataset::write_attribute(const std::string& name, const std::string& value) {
  write_string_attribute(handle_.id(), file_, name, {value}, /*scalar=*/true);
}

}  // namespace autoaccum::hdf5
