// Model: what the trainer needs of a network (built-in mlp/cnn, or a TorchScript file).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace autoaccum::train {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// A model's parameters as the optimizer must see them: one entry per distinct tensor (a tied
// weight is listed once, under the first name that holds it), the frozen ones apart.
struct ParameterSet {
  std::vector<at::Tensor> trainable;  // requires_grad: in the optimizer and the gradient buffer
  std::vector<at::Tensor> frozen;     // requires_grad false: neither
  std::int64_t trainable_elements = 0;
  std::int64_t frozen_elements = 0;
  std::int64_t shared_elements = 0;  // elements of tensors that more than one name holds
  std::string describe() const;      // "N trainable parameters (K frozen, S shared)"
};
ParameterSet distinct_parameters(const NamedTensors& named);

class Model {
 public:
  virtual ~Model() = default;
  // Logits (classification) or predictions (regression) for a micro-batch of inputs.
  virtual at::Tensor forward(const std::vector<at::Tensor>& inputs) = 0;
  // --loss model: forward(inputs..., targets) returns (loss_sum, weight), two scalars; the
  // step's loss is sum(loss_sum) / sum(weight) over the global batch. The built-in models have
  // no loss of their own (UsageError).
  virtual std::pair<at::Tensor, at::Tensor> forward_loss(const std::vector<at::Tensor>& inputs,
                                                         const at::Tensor& targets);
  // Names exactly as named_parameters() / named_buffers() give them (dots kept).
  virtual NamedTensors named_parameters() = 0;
  virtual NamedTensors named_buffers() = 0;
  virtual void set_training(bool training) = 0;
  virtual void to(const c10::Device& device) = 0;  // parameters and buffers
  virtual std::string describe() = 0;
  // A TorchScript model saves itself (with its current parameters and buffers) to `path`;
  // the built-in models cannot (UsageError).
  virtual void save(const std::string& path);
  // Non-empty when the model's layers ignore train/eval mode (a traced TorchScript module with
  // dropout or BatchNorm): what to tell the user, once.
  virtual std::string mode_warning() { return ""; }
  // Every distinct parameter tensor, trainable or not, in the order of named_parameters().
  std::vector<at::Tensor> parameters();
  ParameterSet parameter_set();
  std::int64_t parameter_count();  // distinct elements, trainable or not
};

struct ModelSpec {
  std::string kind = "mlp";  // mlp | cnn
  std::vector<std::int64_t> hidden{512, 512};
  std::string file;                       // TorchScript; overrides kind
  std::vector<std::int64_t> input_shape;  // one row of the first input
  std::int64_t outputs = 10;
};

// One line for a user from an error LibTorch raised while running a model: the TorchScript
// interpreter's message ends, after its traceback, in "RuntimeError: <what went wrong>"; that is
// the line kept. Other errors give their first line.
std::string torch_error_summary(const std::exception& e);

// Builds the model on the CPU; parameters come from LibTorch's default generator, so seed it
// first. UsageError for an unknown kind or an input shape the kind cannot take.
std::unique_ptr<Model> make_model(const ModelSpec& spec);

}  // namespace autoaccum::train
