// Objective: the loss of a micro-batch, scaled so that accumulated gradients are exact.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "autoaccum/data/slab_reader.hpp"

namespace autoaccum::train {

class Objective {
 public:
  // Classification: int64 labels in [0, classes), cross-entropy. Otherwise regression: float
  // targets of `target_shape` per row, mean squared error over every element.
  Objective(bool classification, std::int64_t classes, std::vector<std::int64_t> target_shape);

  bool classification() const noexcept { return classification_; }
  std::int64_t classes() const noexcept { return classes_; }
  // The micro-batch's loss summed over its rows, divided by the global batch's rows (and, for
  // regression, by the elements per row): summed over micro-batches and ranks, it is the mean
  // loss of the global batch, whatever the split.
  at::Tensor loss(const at::Tensor& output, const at::Tensor& target,
                  std::int64_t global_rows) const;
  // Correctly classified rows of a micro-batch (classification only).
  at::Tensor correct(const at::Tensor& output, const at::Tensor& target) const;
  // Empty when `output` (for `rows` rows) is what loss() can take; else what is wrong, naming
  // both shapes, for the setup trial's message.
  std::string check_output(const at::Tensor& output, std::int64_t rows,
                           const std::string& targets_name) const;
  std::string describe() const;  // "cross-entropy over 10 classes" | "mean squared error"

 private:
  bool classification_;
  std::int64_t classes_;
  std::vector<std::int64_t> target_shape_;
  std::int64_t target_elements_ = 1;
};

using data::shape_text;

}  // namespace autoaccum::train
