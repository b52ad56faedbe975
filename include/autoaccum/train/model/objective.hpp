// Objective: the loss of a micro-batch as a sum and a weight, so that accumulated gradients are
// exact whatever the split into micro-batches and ranks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "autoaccum/data/slab_reader.hpp"

namespace autoaccum::train {

using data::shape_text;

// The global batch's loss is sum(loss sums) / sum(weights) over every micro-batch of every
// rank. Each micro-batch contributes its loss summed over what it counts (rows, tokens,
// elements) and that count; the sums and counts travel in the step's one all-reduce, and the
// reduced gradient is divided once by the global count. Nothing depends on how the counted
// items are spread over micro-batches and ranks (padding, ignored positions, a short last
// micro-batch).
class Objective {
 public:
  enum class Kind {
    kCrossEntropy,        // int64 labels [rows] (or [rows, T] tokens), logits [rows, (T,) C]
    kMeanSquaredError,    // float targets, predictions of as many values per row
    kBinaryCrossEntropy,  // float targets in [0, 1], logits of the same shape
    kModel                // the model's forward(inputs..., targets) -> (loss_sum, weight)
  };

  // From --loss (auto | cross-entropy | mse | bce | model), the target's type and row shape, and
  // the classes of integer targets. `auto`: integer targets -> cross-entropy, float -> mse. A loss
  // that cannot take the targets is a UsageError naming --loss and the dataset.
  static Objective choose(const std::string& loss, const data::FieldSpec& target,
                          std::int64_t classes, std::int64_t ignore_index);

  Kind kind() const noexcept { return kind_; }
  bool classification() const noexcept { return kind_ == Kind::kCrossEntropy; }
  bool from_model() const noexcept { return kind_ == Kind::kModel; }
  bool tokens() const noexcept { return classification() && !target_shape_.empty(); }
  std::int64_t classes() const noexcept { return classes_; }
  std::int64_t ignore_index() const noexcept { return ignore_index_; }

  struct Terms {
    at::Tensor sum;     // the loss summed over the counted items (a 0-dim tensor)
    at::Tensor weight;  // how many items were counted (a 0-dim float tensor, no gradient)
  };
  Terms terms(const at::Tensor& output, const at::Tensor& target) const;
  // Correctly predicted counted items (cross-entropy only): rows, or tokens.
  at::Tensor correct(const at::Tensor& output, const at::Tensor& target) const;
  // Empty when `output` (for `rows` rows) is what terms() can take; else what is wrong, naming
  // both shapes, for the setup trial's message.
  std::string check_output(const at::Tensor& output, std::int64_t rows,
                           const std::string& targets_name) const;
  // "cross-entropy per token (ignoring label -100), over all counted tokens of the global batch"
  std::string describe() const;
  std::string unit() const;  // what one counted item is: "row", "token", "value"

 private:
  Objective(Kind kind, std::int64_t classes, std::vector<std::int64_t> target_shape,
            std::int64_t ignore_index);
  Kind kind_;
  std::int64_t classes_;
  std::vector<std::int64_t> target_shape_;
  std::int64_t target_elements_ = 1;
  std::int64_t ignore_index_;
};

}  // namespace autoaccum::train
