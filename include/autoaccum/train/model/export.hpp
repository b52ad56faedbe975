// Export: a checkpoint's parameters and buffers put back into the user's TorchScript module.
#pragma once

#include <string>

namespace autoaccum::train {

struct ExportSummary {
  std::int64_t step = 0;  // the checkpoint's step
  std::int64_t tensors = 0;
  bool verified = false;  // the checkpoint matched its checksums (false: written before them)
};

// Loads `model_file`, copies every parameter and buffer of `checkpoint` into it (names as
// named_parameters()/named_buffers() give them), puts it in eval mode and saves it to `out`
// atomically, loadable with torch.jit.load. InputError when a name or shape does not match.
ExportSummary export_scripted(const std::string& checkpoint, const std::string& model_file,
                              const std::string& out);

}  // namespace autoaccum::train
