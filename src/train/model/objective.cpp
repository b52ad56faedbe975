// Objective: loss sums and the counts that normalise them.
#include "autoaccum/train/model/objective.hpp"

#include <torch/torch.h>

#include <sstream>

#include "autoaccum/core/error.hpp"

namespace autoaccum::train {
namespace F = torch::nn::functional;

Objective::Objective(Kind kind, std::int64_t classes, std::vector<std::int64_t> target_shape,
                     std::int64_t ignore_index)
    : kind_(kind),
      classes_(classes),
      target_shape_(std::move(target_shape)),
      ignore_index_(ignore_index) {
  for (auto d : target_shape_)
    target_elements_ *= d;
}

Objective Objective::choose(const std::string& loss, const data::FieldSpec& target,
                            std::int64_t classes, std::int64_t ignore_index) {
  const bool integer = target.type == data::FieldType::kInt64;
  const std::string what = "--targets " + target.name + " (" + data::to_string(target.type) + " " +
                           shape_text(target.row_shape) + " per row)";
  if (loss == "auto") {
    return integer ? Objective(Kind::kCrossEntropy, classes, target.row_shape, ignore_index)
                   : Objective(Kind::kMeanSquaredError, 0, target.row_shape, ignore_index);
  }
  if (loss == "cross-entropy") {
    if (!integer) {
      throw UsageError("--loss cross-entropy needs integer class labels, but " + what +
                       " holds floats (store class ids as int64, or use --loss mse or bce)");
    }
    return Objective(Kind::kCrossEntropy, classes, target.row_shape, ignore_index);
  }
  if (loss == "mse" || loss == "bce") {
    if (integer) {
      throw UsageError("--loss " + loss + " needs float targets, but " + what +
                       " holds integer labels (use --loss cross-entropy)");
    }
    return Objective(loss == "mse" ? Kind::kMeanSquaredError : Kind::kBinaryCrossEntropy, 0,
                     target.row_shape, ignore_index);
  }
  if (loss == "model") {
    return Objective(Kind::kModel, integer ? classes : 0, target.row_shape, ignore_index);
  }
  throw UsageError("--loss: '" + loss + "' is not one of auto, cross-entropy, mse, bce, model");
}

Objective::Terms Objective::terms(const at::Tensor& output, const at::Tensor& target) const {
  const auto count = [&](std::int64_t n) {
    return at::full({}, static_cast<double>(n), output.options().dtype(at::kFloat));
  };
  switch (kind_) {
    case Kind::kCrossEntropy: {
      const at::Tensor logits = output.reshape({-1, output.size(-1)});
      const at::Tensor labels = target.reshape({-1});
      at::Tensor sum = F::cross_entropy(
          logits, labels,
          F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(ignore_index_));
      return {sum, labels.ne(ignore_index_).sum().to(at::kFloat)};
    }
    case Kind::kMeanSquaredError:
      return {F::mse_loss(output.reshape(target.sizes()), target,
                          F::MSELossFuncOptions().reduction(torch::kSum)),
              count(target.numel())};
    case Kind::kBinaryCrossEntropy:
      return {F::binary_cross_entropy_with_logits(
                  output.reshape(target.sizes()), target,
                  F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kSum)),
              count(target.numel())};
    case Kind::kModel:
      break;
  }
  throw Error("internal: --loss model's terms come from the model");
}

at::Tensor Objective::correct(const at::Tensor& output, const at::Tensor& target) const {
  const at::Tensor predicted = output.argmax(-1).reshape({-1});
  const at::Tensor labels = target.reshape({-1});
  return predicted.eq(labels).logical_and(labels.ne(ignore_index_)).sum();
}

std::string Objective::check_output(const at::Tensor& output, std::int64_t rows,
                                    const std::string& targets_name) const {
  const std::vector<std::int64_t> shape(output.sizes().begin(), output.sizes().end());
  std::vector<std::int64_t> expected{rows};
  expected.insert(expected.end(), target_shape_.begin(), target_shape_.end());
  // Document data: a per-token target's length (-1) is the micro-batch's padded length.
  for (std::size_t i = 1; i < expected.size(); ++i) {
    if (expected[i] < 0 && i < shape.size()) expected[i] = shape[i];
  }
  std::ostringstream problem;
  if (classification()) {
    bool fits = shape.size() == expected.size() + 1 && shape.back() >= classes_;
    for (std::size_t i = 0; fits && i < expected.size(); ++i)
      fits = shape[i] == expected[i];
    if (!fits) {
      std::vector<std::int64_t> logits = expected;
      logits.push_back(classes_);
      problem << "forward returned shape " << shape_text(shape) << " for " << rows
              << " rows, but --targets " << targets_name << " holds class labels "
              << shape_text(expected) << " of " << classes_ << " classes: the output must be "
              << shape_text(logits) << " logits";
    }
  } else {
    std::int64_t per_row = 1;
    for (std::size_t i = 1; i < shape.size(); ++i)
      per_row *= shape[i];
    if (shape.empty() || shape[0] != rows || per_row != target_elements_) {
      problem << "forward returned shape " << shape_text(shape) << " for " << rows
              << " rows, but --targets " << targets_name << " holds float values of shape "
              << shape_text(expected) << " (" << target_elements_ << " per row)";
    }
  }
  if (problem.str().empty() && !at::isFloatingType(output.scalar_type()))
    problem << "forward returned " << output.scalar_type() << " values; the loss needs floats";
  return problem.str();
}

std::string Objective::unit() const {
  if (from_model()) return "unit of weight";
  if (classification()) return tokens() ? "token" : "row";
  return "value";
}

std::string Objective::describe() const {
  const std::string ignored = " (label " + std::to_string(ignore_index_) + " ignored)";
  switch (kind_) {
    case Kind::kCrossEntropy:
      if (tokens()) {
        return "cross-entropy per token over " + std::to_string(classes_) +
               " classes, over all counted tokens of the global batch" + ignored;
      }
      return "cross-entropy over " + std::to_string(classes_) +
             " classes, mean over the counted rows of the global batch" + ignored;
    case Kind::kMeanSquaredError:
      return "mean squared error over " + std::to_string(target_elements_) +
             " value(s) per row, mean over all values of the global batch";
    case Kind::kBinaryCrossEntropy:
      return "binary cross-entropy with logits over " + std::to_string(target_elements_) +
             " value(s) per row, mean over all values of the global batch";
    case Kind::kModel:
      return "the model's own (loss_sum, weight): sum of loss_sum / sum of weight over the "
             "global batch";
  }
  return "";
}

}  // namespace autoaccum::train
