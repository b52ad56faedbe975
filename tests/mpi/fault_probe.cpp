// fault_probe MODE RANK: one rank fails on purpose, to test that every rank leaves together.
//   alone: rank RANK throws while the others wait in a barrier (only MPI_Abort can end them)
//   agree: rank RANK fails inside comm::collectively, so every rank exits through MPI_Finalize
//   ok:    nobody fails
// fault_probe stall RANK SECONDS TIMEOUT: with the collective watchdog at TIMEOUT seconds, rank
//   RANK sleeps SECONDS before a barrier (it is alive: its watchdog thread answers)
// fault_probe freeze RANK TIMEOUT: the same, but rank RANK's watchdog thread is gone before the
//   barrier and its main thread sleeps: as a dead node looks to the others, it never answers.
//   (Not SIGSTOP: a stopped process under MPI_Abort's clean-up has crashed Open MPI 4.1's
//   mpiexec in its PMIx server's finalize, a launcher failure the watchdog cannot change.)
// fault_probe late RANK SECONDS TIMEOUT: every rank finishes, then rank RANK sleeps SECONDS
//   before it leaves: the others wait for it in MPI_Finalize, which has TIMEOUT too
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
        if (args.size() != 2 && !(args.size() == 4 && (args[0] == "stall" || args[0] == "late")) &&
            !(args.size() == 3 && args[0] == "freeze"))
          throw CollectiveError(
              "usage: fault_probe alone|agree|ok RANK, stall|late RANK S T, or freeze RANK T",
              ExitCode::kUsage, 0);
        const std::string& mode = args[0];
        const int failing = std::stoi(args[1]);
        if (mode == "late") {
          comm::watchdog().configure(
              std::chrono::milliseconds(static_cast<long>(std::stod(args.back()) * 1000)),
              world.rank());
          world.barrier();
          if (world.rank() == 0) std::cout << "fault_probe: all ranks finished" << std::endl;
          if (world.rank() == failing)
            std::this_thread::sleep_for(std::chrono::duration<double>(std::stod(args[2])));
          return 0;
        }
        if (mode == "stall" || mode == "freeze") {
          comm::watchdog().configure(
              std::chrono::milliseconds(static_cast<long>(std::stod(args.back()) * 1000)),
              world.rank());
          comm::watchdog().set_context("in the probe's " + mode);
          if (world.rank() == failing && mode == "freeze") {
            comm::watchdog().configure(std::chrono::milliseconds(0), world.rank());
            std::this_thread::sleep_for(std::chrono::minutes(10));  // ended by the others' abort
          }
          if (world.rank() == failing && mode == "stall")
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
