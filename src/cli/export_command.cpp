// autoaccum export: a trained TorchScript module from a checkpoint, for PyTorch.
#include <iostream>
#include <string>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/core/distinct_paths.hpp"
#include "autoaccum/train/model/export.hpp"
#include "commands.hpp"

namespace po = boost::program_options;

namespace autoaccum::cli {

Command export_command() {
  Command c;
  c.name = "export";
  c.summary = "Write a checkpoint's parameters and buffers into the TorchScript model file.";
  c.usage = "autoaccum export --checkpoint CK.h5 --model-file MODEL.pt --out TRAINED.pt";
  c.options.add_options()("checkpoint", po::value<std::string>()->required()->value_name("CK.h5"),
                          "checkpoint written by autoaccum train")(
      "model-file", po::value<std::string>()->required()->value_name("MODEL.pt"),
      "the TorchScript file the run trained (--model-file of the run)")(
      "out", po::value<std::string>()->required()->value_name("TRAINED.pt"),
      "where to write the trained module (torch.jit.load reads it)");
  c.run = [](const po::variables_map& vm, comm::Communicator& world) {
    comm::collectively(world, [&] {
      if (world.rank() != 0) return;  // one writer
      const std::string out = vm["out"].as<std::string>();
      core::check_outputs_apart({{"--checkpoint", vm["checkpoint"].as<std::string>()},
                                 {"--model-file", vm["model-file"].as<std::string>()}},
                                {{"--out", out}});
      const auto summary = train::export_scripted(vm["checkpoint"].as<std::string>(),
                                                  vm["model-file"].as<std::string>(), out);
      std::cout << "exported " << summary.tensors << " tensors from step " << summary.step
                << (summary.verified ? " (checksums verified)"
                                     : " (written before checksums: not verified)")
                << " to " << out << " (eval mode; torch.jit.load(\"" << out << "\") in Python)"
                << std::endl;
    });
    return 0;
  };
  return c;
}

}  // namespace autoaccum::cli
