// HDF5 RAII layer: datasets (shape, type, layout, row slabs).
#include <algorithm>
#include <cstring>

#include "autoaccum/hdf5/hdf5.hpp"
#include "internal.hpp"

namespace autoaccum::hdf5 {
using detail::check;
using detail::fail;
using detail::quoted;

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
    if (!is_signed && size == 2) return DType::kUInt16;
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

}  // namespace autoaccum::hdf5
