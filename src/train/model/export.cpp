// Export: checkpoint tensors into a TorchScript module, saved atomically.
#include "autoaccum/train/model/export.hpp"

#include <torch/torch.h>

#include "autoaccum/core/atomic_write.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/io/checkpoint.hpp"
#include "autoaccum/train/model/model.hpp"
#include "autoaccum/train/model/objective.hpp"

namespace autoaccum::train {
namespace {

void copy_into(const NamedTensors& from, NamedTensors to, const std::string& kind,
               const std::string& checkpoint, const std::string& model_file, std::int64_t& copied) {
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : to) {
    auto it =
        std::find_if(from.begin(), from.end(), [&](const auto& p) { return p.first == name; });
    if (it == from.end()) {
      throw InputError("'" + checkpoint + "' has no " + kind + " '" + name + "' that '" +
                       model_file + "' has: was it written for another model?");
    }
    if (it->second.numel() != tensor.numel()) {
      const std::vector<std::int64_t> saved(it->second.sizes().begin(), it->second.sizes().end());
      const std::vector<std::int64_t> wanted(tensor.sizes().begin(), tensor.sizes().end());
      throw InputError("'" + checkpoint + "': " + kind + " '" + name + "' has shape " +
                       shape_text(saved) + " but '" + model_file + "' has " + shape_text(wanted));
    }
    tensor.copy_(it->second.view(tensor.sizes()));
    ++copied;
  }
  for (const auto& [name, tensor] : from) {
    if (std::none_of(to.begin(), to.end(), [&](const auto& p) { return p.first == name; })) {
      throw InputError("'" + checkpoint + "' has a " + kind + " '" + name + "' that '" +
                       model_file + "' lacks: was it written for another model?");
    }
  }
}

}  // namespace

ExportSummary export_scripted(const std::string& checkpoint, const std::string& model_file,
                              const std::string& out) {
  ModelSpec spec;
  spec.file = model_file;
  auto model = make_model(spec);
  const io::Checkpoint c = io::read_checkpoint(checkpoint);
  ExportSummary summary;
  summary.step = c.step;
  summary.verified = c.verified;
  copy_into(c.params, model->named_parameters(), "parameter", checkpoint, model_file,
            summary.tensors);
  copy_into(c.buffers, model->named_buffers(), "buffer", checkpoint, model_file, summary.tensors);
  model->set_training(false);  // ready for inference; model.train() in Python to train on
  write_atomically(out, [&](const std::string& temporary) { model->save(temporary); });
  return summary;
}

}  // namespace autoaccum::train
