// Batch: named tensors sharing dimension 0; micro-batches are views into it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace autoaccum::data {

class Batch {
 public:
  Batch() = default;

  // Adds a field; every field must have the same number of rows (dimension 0).
  void add(std::string name, at::Tensor tensor);

  std::int64_t rows() const noexcept { return rows_; }
  std::size_t size() const noexcept { return tensors_.size(); }
  bool empty() const noexcept { return tensors_.empty(); }
  const std::vector<std::string>& names() const noexcept { return names_; }
  const at::Tensor& operator[](std::size_t i) const { return tensors_.at(i); }
  const at::Tensor& get(const std::string& name) const;

  // Rows [offset, offset + rows) of every field as views (no copy); `rows` is clipped at the end.
  Batch slice(std::int64_t offset, std::int64_t rows) const;

  // Global row index (in the concatenated shards) of this batch's first row; -1 if unknown.
  std::int64_t first_row = -1;

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> tensors_;
  std::int64_t rows_ = 0;
};

}  // namespace autoaccum::data
