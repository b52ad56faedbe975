// HDF5 RAII layer, its shared part: the library lock, error capture, handles and types. Files,
// datasets and attributes are in file.cpp, dataset.cpp and attribute.cpp.
#include "autoaccum/hdf5/hdf5.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "internal.hpp"

namespace autoaccum::hdf5 {
namespace {

// Collects the innermost (first pushed) description of the error stack.
herr_t innermost(unsigned n, const H5E_error2_t* error, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && error && error->desc) *out = error->desc;
  return 0;
}

std::recursive_mutex& library_lock() {
  static std::recursive_mutex lock;
  return lock;
}

}  // namespace

namespace detail {

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

}  // namespace detail

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
    case DType::kUInt16:
      return "uint16";
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
    case DType::kUInt16:
      return H5T_NATIVE_UINT16;
    case DType::kOther:
      break;
  }
  throw Error("hdf5::native_type: no native type for 'other'");
}

}  // namespace autoaccum::hdf5
