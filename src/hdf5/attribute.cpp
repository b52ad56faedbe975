// HDF5 RAII layer: attributes of files and datasets.
#include <algorithm>
#include <cstring>
#include <sstream>

#include "autoaccum/hdf5/hdf5.hpp"
#include "internal.hpp"

namespace autoaccum::hdf5 {
using detail::check;
using detail::fail;
using detail::quoted;

bool File::has_attribute(const std::string& name) const {
  ErrorSilencer quiet;
  return H5Aexists(id(), name.c_str()) > 0;
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

// An attribute as stored, whatever its class: what attribute_value, describe_attribute and
// read_int_attribute each pick from. Integers are read as int64, floats as double.
struct RawAttribute {
  H5T_class_t kind = H5T_NO_CLASS;
  bool scalar = false;  // a scalar dataspace (not a one-element array)
  std::size_t count = 0;
  std::vector<std::int64_t> integers;
  std::vector<double> floats;
  std::vector<std::string> strings;
};

RawAttribute read_raw_attribute(hid_t object, const std::string& name, const std::string& where) {
  Handle attribute(check(H5Aopen(object, name.c_str(), H5P_DEFAULT), where + " cannot be opened"));
  Handle type(check(H5Aget_type(attribute.id()), where));
  Handle space(check(H5Aget_space(attribute.id()), where));
  RawAttribute raw;
  raw.kind = H5Tget_class(type.id());
  raw.scalar = H5Sget_simple_extent_type(space.id()) == H5S_SCALAR;
  raw.count = static_cast<std::size_t>(check(H5Sget_simple_extent_npoints(space.id()), where));
  switch (raw.kind) {
    case H5T_INTEGER:
      raw.integers.resize(raw.count);
      if (raw.count > 0)
        check(H5Aread(attribute.id(), H5T_NATIVE_INT64, raw.integers.data()),
              where + " cannot be read");
      break;
    case H5T_FLOAT:
      raw.floats.resize(raw.count);
      if (raw.count > 0)
        check(H5Aread(attribute.id(), H5T_NATIVE_DOUBLE, raw.floats.data()),
              where + " cannot be read");
      break;
    case H5T_STRING:
      raw.strings = read_attribute_strings(attribute.id(), where);
      break;
    default:
      break;
  }
  return raw;
}

}  // namespace

void File::write_attribute(const std::string& name, const std::string& value) {
  write_string_attribute(id(), path_, name, {value}, /*scalar=*/true);
}

void File::write_attribute(const std::string& name, const std::vector<std::string>& values) {
  write_string_attribute(id(), path_, name, values, /*scalar=*/false);
}

std::int64_t File::read_int_attribute(const std::string& name) const {
  ErrorSilencer quiet;
  const std::string where = quoted(path_) + ": attribute '" + name + "'";
  const RawAttribute raw = read_raw_attribute(id(), name, where);
  if (raw.kind != H5T_INTEGER) throw Hdf5Error(where + " is not an integer");
  if (raw.count != 1) throw Hdf5Error(where + " is not a scalar");
  return raw.integers.front();
}

AttributeValue File::attribute_value(const std::string& name) const {
  ErrorSilencer quiet;
  const std::string where = quoted(path_) + ": attribute '" + name + "'";
  RawAttribute raw = read_raw_attribute(id(), name, where);
  switch (raw.kind) {
    case H5T_INTEGER:
      if (raw.count == 1) return raw.integers.front();
      break;
    case H5T_FLOAT:
      if (raw.count == 1) return raw.floats.front();
      break;
    case H5T_STRING:
      if (raw.scalar && raw.strings.size() == 1) return raw.strings.front();
      return std::move(raw.strings);
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
  const RawAttribute raw = read_raw_attribute(id(), name, where);
  std::ostringstream out;
  auto list = [&](const auto& values) {
    if (values.size() != 1) out << "[";
    for (std::size_t i = 0; i < values.size(); ++i)
      out << (i ? ", " : "") << values[i];
    if (values.size() != 1) out << "]";
  };
  switch (raw.kind) {
    case H5T_INTEGER:
      list(raw.integers);
      break;
    case H5T_FLOAT:
      list(raw.floats);
      break;
    case H5T_STRING:
      list(raw.strings);
      break;
    default:
      out << "(" << raw.count << " value(s) of an unsupported type)";
  }
  return out.str();
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
