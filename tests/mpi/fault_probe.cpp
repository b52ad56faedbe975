// fault_probe MODE RANK: one rank fails on purpose, to test that every rank leaves together.
//   alone: rank RANK throws while the others wait in a barrier (only MPI_Abort can end them)
//   agree: rank RANK fails inside comm::collectively, so every rank exits through MPI_Finalize
//   ok:    nobody fails
// fault_probe stall RANK SECONDS TIMEOUT: with the collective watchdog at TIMEOUT seconds, rank
//   RANK sleeps SECONDS before a barrier (with AUTOACCUM_WATCHDOG_SKIP_ARRIVAL=1 the others wait
//   inside the blocking barrier instead: the watchdog thread's half)
#include <chrono>
#include <iostream>
#include <string>
#include <thread>

#include "autoaccum/cli/spmd_main.hpp"
#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/comm/watchdog.hpp"
#include "autoaccum/core/error.hpp"

int main(int argc, char** argv) {
  using namespace autoaccum;
  return cli::spmd_main(
      argc, argv, [](comm::Communicator& world, const std::vector<std::string>& args) {
        if (args.size() != 2 && !(args.size() == 4 && args[0] == "stall"))
          throw CollectiveError("usage: fault_probe alone|agree|ok RANK, or stall RANK S T",
                                ExitCode::kUsage, 0);
        const std::string& mode = args[0];
        const int failing = std::stoi(args[1]);
        if (mode == "stall") {
          comm::watchdog().configure(
              std::chrono::milliseconds(static_cast<long>(std::stod(args[3]) * 1000)),
              world.rank());
          comm::watchdog().set_context("in the probe's stall");
          if (world.rank() == failing)
            std::this_thread::sleep_for(std::chrono::duration<double>(std::stod(args[2])));
          world.barrier();
        } else if (mode == "alone") {
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
