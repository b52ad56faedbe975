// The built-in models and the TorchScript adapter.
#include "autoaccum/train/model/model.hpp"

#include <caffe2/serialize/inline_container.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "autoaccum/core/error.hpp"
#include "autoaccum/train/model/fused_linear.hpp"

namespace autoaccum::train {
namespace {

std::int64_t product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape)
    n *= d;
  return n;
}

// nn::Linear's parameters, names and initialisation, with accumulating_linear's backward (the
// weight-gradient GEMM adds into the persistent gradient buffer).
class FusedLinearImpl : public torch::nn::Cloneable<FusedLinearImpl> {
 public:
  FusedLinearImpl(std::int64_t in, std::int64_t out) : in_(in), out_(out) { reset(); }
  void reset() override {
    torch::nn::LinearImpl init(in_, out_);  // the same random draws as nn::Linear
    weight = register_parameter("weight", init.weight);
    bias = register_parameter("bias", init.bias);
  }
  at::Tensor forward(const at::Tensor& x) { return accumulating_linear(x, weight, bias); }
  void pretty_print(std::ostream& stream) const override {
    stream << "FusedLinear(in=" << in_ << ", out=" << out_ << ")";
  }
  at::Tensor weight, bias;

 private:
  std::int64_t in_, out_;
};
TORCH_MODULE(FusedLinear);

// AUTOACCUM_FUSED_LINEAR=0 builds plain nn::Linear layers instead (the benchmark's comparison).
bool fused_linear_enabled() {
  const char* value = std::getenv("AUTOACCUM_FUSED_LINEAR");
  return !(value && std::string(value) == "0");
}

torch::nn::AnyModule linear(std::int64_t in, std::int64_t out) {
  if (fused_linear_enabled()) return torch::nn::AnyModule(FusedLinear(in, out));
  return torch::nn::AnyModule(torch::nn::Linear(in, out));
}

class ModuleModel final : public Model {
 public:
  ModuleModel(torch::nn::Sequential net, std::string description)
      : net_(std::move(net)), description_(std::move(description)) {}
  at::Tensor forward(const std::vector<at::Tensor>& inputs) override {
    if (inputs.size() != 1) {
      throw UsageError("the built-in models take one input dataset; use --model-file for several");
    }
    return net_->forward(inputs.front());
  }
  NamedTensors named_parameters() override {
    NamedTensors out;
    for (const auto& item : net_->named_parameters())
      out.emplace_back(item.key(), item.value());
    return out;
  }
  NamedTensors named_buffers() override {
    NamedTensors out;
    for (const auto& item : net_->named_buffers())
      out.emplace_back(item.key(), item.value());
    return out;
  }
  void set_training(bool training) override { net_->train(training); }
  void to(const c10::Device& device) override { net_->to(device); }
  std::string describe() override { return description_; }

 private:
  torch::nn::Sequential net_;
  std::string description_;
};

class ScriptModel final : public Model {
 public:
  explicit ScriptModel(const std::string& path) : path_(path) {
    if (access(path.c_str(), F_OK) != 0)
      throw InputError("--model-file '" + path + "' does not exist");
    if (access(path.c_str(), R_OK) != 0)
      throw InputError("--model-file '" + path + "' is not readable (permissions)");
    try {
      extra_files_ = extra_file_names(path);
      module_ = torch::jit::load(path, c10::nullopt, extra_files_);
    } catch (const c10::Error& e) {
      const std::string text = e.what_without_backtrace();
      // torch.save() writes a pickled module or state dict, which LibTorch cannot run.
      if (text.find("constants.pkl") != std::string::npos) {
        throw InputError("--model-file '" + path +
                         "' was saved with torch.save(), not as TorchScript: save it with "
                         "torch.jit.script(model).save('" +
                         path + "') (docs/models.md)");
      }
      throw InputError("--model-file '" + path +
                       "' is not a TorchScript module: " + torch_error_summary(e));
    }
  }
  // A tensor; or a tuple whose first element is the output; or a dict with key "logits" (as
  // Hugging Face models return).
  at::Tensor forward(const std::vector<at::Tensor>& inputs) override {
    std::vector<torch::jit::IValue> arguments(inputs.begin(), inputs.end());
    auto output = module_.forward(arguments);
    if (output.isTensor()) return output.toTensor();
    if (output.isTuple()) {
      const auto& elements = output.toTupleRef().elements();
      if (!elements.empty() && elements[0].isTensor()) return elements[0].toTensor();
    }
    if (output.isGenericDict()) {
      for (const auto& entry : output.toGenericDict()) {
        if (entry.key().isString() && entry.key().toStringRef() == "logits" &&
            entry.value().isTensor())
          return entry.value().toTensor();
      }
    }
    throw InputError("forward returned a " + output.tagKind() +
                     " autoaccum cannot read; it needs a tensor (logits [rows, classes] or "
                     "predictions), a tuple whose first element is one, or a dict with a "
                     "\"logits\" tensor");
  }
  std::pair<at::Tensor, at::Tensor> forward_loss(const std::vector<at::Tensor>& inputs,
                                                 const at::Tensor& targets) override {
    std::vector<torch::jit::IValue> arguments(inputs.begin(), inputs.end());
    arguments.emplace_back(targets);
    auto output = module_.forward(arguments);
    const auto bad = [&] {
      return InputError("--loss model: forward(inputs..., targets) returned a " + output.tagKind() +
                        "; it must return a tuple (loss_sum, weight) of two scalar tensors");
    };
    if (!output.isTuple()) throw bad();
    const auto& elements = output.toTupleRef().elements();
    if (elements.size() != 2 || !elements[0].isTensor() || !elements[1].isTensor()) throw bad();
    const at::Tensor sum = elements[0].toTensor();
    const at::Tensor weight = elements[1].toTensor();
    if (sum.numel() != 1 || weight.numel() != 1) throw bad();
    return {sum.reshape({}), weight.detach().reshape({}).to(at::kFloat)};
  }
  NamedTensors named_parameters() override {
    NamedTensors out;
    for (const auto& item : module_.named_parameters())
      out.emplace_back(item.name, item.value);
    return out;
  }
  NamedTensors named_buffers() override {
    NamedTensors out;
    for (const auto& item : module_.named_buffers())
      out.emplace_back(item.name, item.value);
    return out;
  }
  void set_training(bool training) override { module_.train(training); }
  void to(const c10::Device& device) override { module_.to(device); }
  std::string describe() override { return "TorchScript " + path_; }
  std::string mode_warning() override {
    // A module made by torch.jit.trace records dropout and BatchNorm with the mode they were
    // traced in as a constant: its graphs hold the operations but never read `training`.
    bool mode_layers = false;
    bool reads_training = false;
    std::function<void(torch::jit::Block*)> visit = [&](torch::jit::Block* block) {
      for (torch::jit::Node* node : block->nodes()) {
        const std::string kind = node->kind().toQualString();
        if (kind.find("dropout") != std::string::npos ||
            kind.find("batch_norm") != std::string::npos)
          mode_layers = true;
        if (node->kind() == c10::prim::GetAttr && node->s(c10::attr::name) == "training")
          reads_training = true;
        for (torch::jit::Block* inner : node->blocks())
          visit(inner);
      }
    };
    for (const auto& module : module_.modules()) {
      for (const auto& method : module.get_methods())
        visit(method.graph()->block());
    }
    if (!mode_layers || reads_training) return "";
    return "--model-file '" + path_ +
           "' looks made by torch.jit.trace: its dropout and BatchNorm run as they did when "
           "traced, in training and in evaluation alike (evaluation is not in eval mode); make it "
           "with torch.jit.script to let them follow the mode (docs/models.md)";
  }
  // The extra files the model file carried (jobs/models/hf.py's configuration, a user's own
  // metadata) travel into the exported file unchanged.
  void save(const std::string& path) override { module_.save(path, extra_files_); }

 private:
  // The names of the archive's extra files ("<archive>/extra/NAME"), as keys for jit::load to
  // fill: LibTorch reads back only the extra files it is asked for.
  static torch::jit::ExtraFilesMap extra_file_names(const std::string& path) {
    torch::jit::ExtraFilesMap names;
    caffe2::serialize::PyTorchStreamReader reader(path);
    const std::string marker = "extra/";
    for (const auto& record : reader.getAllRecords()) {
      if (record.rfind(marker, 0) == 0 && record.size() > marker.size())
        names.emplace(record.substr(marker.size()), "");
    }
    return names;
  }

  std::string path_;
  torch::jit::Module module_;
  torch::jit::ExtraFilesMap extra_files_;
};

}  // namespace

ParameterSet distinct_parameters(const NamedTensors& named) {
  ParameterSet set;
  // Identity is the TensorImpl: `dec.weight = enc.weight` gives two names, one tensor.
  std::vector<const c10::TensorImpl*> seen;
  std::vector<const c10::TensorImpl*> counted_shared;
  for (const auto& [name, tensor] : named) {
    const auto* impl = tensor.unsafeGetTensorImpl();
    if (std::find(seen.begin(), seen.end(), impl) != seen.end()) {
      if (std::find(counted_shared.begin(), counted_shared.end(), impl) == counted_shared.end()) {
        counted_shared.push_back(impl);
        set.shared_elements += tensor.numel();
      }
      continue;
    }
    seen.push_back(impl);
    if (tensor.requires_grad()) {
      set.trainable.push_back(tensor);
      set.trainable_elements += tensor.numel();
    } else {
      set.frozen.push_back(tensor);
      set.frozen_elements += tensor.numel();
    }
  }
  return set;
}

std::string ParameterSet::describe() const {
  std::ostringstream text;
  text << trainable_elements << " trainable parameters (" << frozen_elements << " frozen, "
       << shared_elements << " shared)";
  return text.str();
}

std::string torch_error_summary(const std::exception& e) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = torch_error ? torch_error->what_without_backtrace() : e.what();
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r'))
      line.pop_back();
    if (!line.empty()) lines.push_back(line);
  }
  std::string chosen = lines.empty() ? text : lines.front();
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    const auto colon = it->find("Error: ");
    const bool named =
        colon != std::string::npos && colon > 0 && it->find(' ') > colon && (*it)[0] != ' ';
    if (named) {
      chosen = it->substr(colon + 7);
      break;
    }
  }
  const auto raised = chosen.find("Exception raised from");
  if (raised != std::string::npos) chosen = chosen.substr(0, raised);
  if (chosen.size() > 400) chosen = chosen.substr(0, 397) + "...";
  return chosen;
}

std::pair<at::Tensor, at::Tensor> Model::forward_loss(const std::vector<at::Tensor>&,
                                                      const at::Tensor&) {
  throw UsageError(
      "--loss model needs a TorchScript model (--model-file) whose forward takes "
      "the targets last and returns (loss_sum, weight)");
}

void Model::save(const std::string&) {
  throw UsageError("only a TorchScript model (--model-file) can be exported");
}

std::vector<at::Tensor> Model::parameters() {
  std::vector<at::Tensor> out;
  std::vector<const c10::TensorImpl*> seen;
  for (auto& [name, tensor] : named_parameters()) {
    if (std::find(seen.begin(), seen.end(), tensor.unsafeGetTensorImpl()) != seen.end()) continue;
    seen.push_back(tensor.unsafeGetTensorImpl());
    out.push_back(tensor);
  }
  return out;
}

ParameterSet Model::parameter_set() {
  return distinct_parameters(named_parameters());
}

std::int64_t Model::parameter_count() {
  const ParameterSet set = parameter_set();
  return set.trainable_elements + set.frozen_elements;
}

std::unique_ptr<Model> make_model(const ModelSpec& spec) {
  if (!spec.file.empty()) return std::make_unique<ScriptModel>(spec.file);
  namespace nn = torch::nn;
  std::ostringstream description;
  if (spec.kind == "mlp") {
    nn::Sequential net;
    net->push_back(nn::Flatten());
    std::int64_t width = product(spec.input_shape);
    description << "mlp " << width;
    for (auto h : spec.hidden) {
      if (h < 1) throw UsageError("--hidden: layer widths must be positive");
      net->push_back(linear(width, h));
      net->push_back(nn::ReLU());
      width = h;
      description << "-" << h;
    }
    net->push_back(linear(width, spec.outputs));
    description << "-" << spec.outputs;
    return std::make_unique<ModuleModel>(net, description.str());
  }
  if (spec.kind == "cnn") {
    if (spec.input_shape.size() != 3) {
      std::ostringstream shape;
      for (std::size_t i = 0; i < spec.input_shape.size(); ++i)
        shape << (i ? ", " : "") << spec.input_shape[i];
      throw UsageError(
          "--model cnn needs inputs of shape [channels, height, width] per row; got [" +
          shape.str() + "]");
    }
    const std::int64_t channels = spec.input_shape[0];
    const std::int64_t height = spec.input_shape[1] / 4, width = spec.input_shape[2] / 4;
    if (height < 1 || width < 1) throw UsageError("--model cnn needs images of at least 4x4");
    nn::Sequential net(nn::Conv2d(nn::Conv2dOptions(channels, 16, 5).padding(2)), nn::ReLU(),
                       nn::MaxPool2d(2), nn::Conv2d(nn::Conv2dOptions(16, 32, 5).padding(2)),
                       nn::ReLU(), nn::MaxPool2d(2), nn::Flatten());
    net->push_back(linear(32 * height * width, 128));
    net->push_back(nn::ReLU());
    net->push_back(linear(128, spec.outputs));
    description << "cnn conv5x5(" << channels << "->16)-pool-conv5x5(16->32)-pool-"
                << 32 * height * width << "-128-" << spec.outputs;
    return std::make_unique<ModuleModel>(net, description.str());
  }
  throw UsageError("--model: '" + spec.kind + "' is not one of mlp, cnn (or use --model-file)");
}

}  // namespace autoaccum::train
