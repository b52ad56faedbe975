// Objective: cross-entropy or mean squared error as sums over rows.
#include "autoaccum/train/objective.hpp"

#include <torch/torch.h>

#include <sstream>

namespace autoaccum::train {

Objective::Objective(bool classification, std::int64_t classes,
                     std::vector<std::int64_t> target_shape)
    : classification_(classification), classes_(classes), target_shape_(std::move(target_shape)) {
  for (auto d : target_shape_)
    target_elements_ *= d;
}

at::Tensor Objective::loss(const at::Tensor& output, const at::Tensor& target,
                           std::int64_t global_rows) const {
  namespace F = torch::nn::functional;
  if (classification_) {
    return F::cross_entropy(output, target, F::CrossEntropyFuncOptions().reduction(torch::kSum)) /
           static_cast<double>(global_rows);
  }
  return F::mse_loss(output.reshape(target.sizes()), target,
                     F::MSELossFuncOptions().reduction(torch::kSum)) /
         static_cast<double>(global_rows * target_elements_);
}

at::Tensor Objective::correct(const at::Tensor& output, const at::Tensor& target) const {
  return output.argmax(1).eq(target).sum();
}

std::string Objective::check_output(const at::Tensor& output, std::int64_t rows,
                                    const std::string& targets_name) const {
  const std::vector<std::int64_t> shape(output.sizes().begin(), output.sizes().end());
  std::ostringstream problem;
  if (classification_) {
    if (shape.size() != 2 || shape[0] != rows || shape[1] < classes_) {
      problem << "forward returned shape " << shape_text(shape) << " for " << rows
              << " rows, but --targets " << targets_name << " holds class labels of " << classes_
              << " classes: the output must be [rows, " << classes_ << "] logits";
    }
  } else {
    std::int64_t per_row = 1;
    for (std::size_t i = 1; i < shape.size(); ++i)
      per_row *= shape[i];
    if (shape.empty() || shape[0] != rows || per_row != target_elements_) {
      std::vector<std::int64_t> expected{rows};
      expected.insert(expected.end(), target_shape_.begin(), target_shape_.end());
      problem << "forward returned shape " << shape_text(shape) << " for " << rows
              << " rows, but --targets " << targets_name << " holds float values of shape "
              << shape_text(expected) << " (" << target_elements_ << " per row)";
    }
  }
  if (problem.str().empty() && !at::isFloatingType(output.scalar_type()))
    problem << "forward returned " << output.scalar_type() << " values; the loss needs floats";
  return problem.str();
}

std::string Objective::describe() const {
  if (classification_)
    return "cross-entropy over " + std::to_string(classes_) +
           " classes, mean over the global batch";
  return "mean squared error over " + std::to_string(target_elements_) +
         " value(s) per row, mean over the global batch";
}

}  // namespace autoaccum::train
