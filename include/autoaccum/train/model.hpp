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

class Model {
 public:
  virtual ~Model() = default;
  // Logits (classification) or predictions (regression) for a micro-batch of inputs.
  virtual at::Tensor forward(const std::vector<at::Tensor>& inputs) = 0;
  // Names exactly as named_parameters() / named_buffers() give them (dots kept).
  virtual NamedTensors named_parameters() = 0;
  virtual NamedTensors named_buffers() = 0;
  virtual void set_training(bool training) = 0;
  virtual void to(const c10::Device& device) = 0;  // parameters and buffers
  virtual std::string describe() = 0;
  std::vector<at::Tensor> parameters();
  std::int64_t parameter_count();
};

struct ModelSpec {
  std::string kind = "mlp";  // mlp | cnn
  std::vector<std::int64_t> hidden{512, 512};
  std::string file;                       // TorchScript; overrides kind
  std::vector<std::int64_t> input_shape;  // one row of the first input
  std::int64_t outputs = 10;
};

// Builds the model on the CPU; parameters come from LibTorch's default generator, so seed it
// first. UsageError for an unknown kind or an input shape the kind cannot take.
std::unique_ptr<Model> make_model(const ModelSpec& spec);

}  // namespace autoaccum::train
