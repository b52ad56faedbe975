// Helpers shared by the HDF5 layer's sources (not part of its interface).
#pragma once

#include <string>

namespace autoaccum::hdf5::detail {

// Throws Hdf5Error: `context`, and the innermost HDF5 (or system) reason in parentheses.
[[noreturn]] void fail(const std::string& context);

// `result`, unless it is negative (HDF5's failure): then fail(context).
template <class T>
T check(T result, const std::string& context) {
  if (result < 0) fail(context);
  return result;
}

std::string quoted(const std::string& path);

// A clearer reason than HDF5's for the common ways opening a file fails.
std::string why_cannot_open(const std::string& path);

}  // namespace autoaccum::hdf5::detail
