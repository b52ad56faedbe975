// A small file of rows for tests of the data feed and sizing: x float32 [rows, 2] with
// x[r] = (r, -r), y int64 = r % classes except the last row's, `largest_label`; num_classes
// `classes`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autoaccum/hdf5/hdf5.hpp"

namespace autoaccum::test {

inline std::string write_rows(const std::string& path, std::int64_t rows, std::int64_t classes,
                              std::int64_t largest_label) {
  std::vector<float> x;
  std::vector<std::int64_t> y;
  for (std::int64_t r = 0; r < rows; ++r) {
    x.push_back(static_cast<float>(r));
    x.push_back(-static_cast<float>(r));
    y.push_back(r == rows - 1 ? largest_label : r % classes);
  }
  auto file = hdf5::File::create(path);
  file.create_dataset("x", hdf5::DType::kFloat32, {rows, 2})
      .write_rows(0, rows, hdf5::DType::kFloat32, x.data());
  file.create_dataset("y", hdf5::DType::kInt64, {rows})
      .write_rows(0, rows, hdf5::DType::kInt64, y.data());
  file.write_attribute("num_classes", classes);
  return path;
}

}  // namespace autoaccum::test
