// HDF5 RAII layer: files (open, create, in memory), their datasets and string tables.
#include <algorithm>
#include <cstring>

#include "autoaccum/hdf5/hdf5.hpp"
#include "internal.hpp"

namespace autoaccum::hdf5 {
using detail::check;
using detail::fail;
using detail::quoted;
using detail::why_cannot_open;

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

}  // namespace autoaccum::hdf5
