// fault_probe MODE RANK: one rank fails on purpose, to test that every rank leaves together.
//   alone: rank RANK throws while the others wait in a barrier (only MPI_Abort can end them)
//   agree: rank RANK fails inside comm::collectively, so every rank exits through MPI_Finalize
//   ok:    nobody fails
#include <iostream>
#include <string>

#include "autoaccum/cli/spmd_main.hpp"
#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/core/error.hpp"

int main(int argc, char** argv) {
  using namespace autoaccum;
  return cli::spmd_main(
      argc, argv, [](comm::Communicator& world, const std::vector<std::string>& args) {
        if (args.size() != 2)
          throw CollectiveError("usage: fault_probe alone|agree|ok RANK", ExitCode::kUsage, 0);
        const std::string& mode = args[0];
        const int failing = std::stoi(args[1]);
        if (mode == "alone") {
          if (world.rank() == failing) throw InputError("probe failure on its own");
          world.barrier();  // the other ranks would wait here forever
        } else if (mode == "agree") {
          comm::collectively(world, [&] {
            if (world.rank() == failing) throw InputError("probe failure, agreed");
          });
        }
        world.barrier();
        if (world.rank() == 0) std::cout << "fault_probe: all ranks finished" << std::endl;
        return 0;
      });
}
