// run_app: picks the subcommand, prints help, and hands the options to the command.
#include "autoaccum/cli/app.hpp"

#include <algorithm>
#include <iostream>
#include <sstream>

#include "autoaccum/cli/command.hpp"
#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/core/error.hpp"
#include "commands.hpp"

namespace po = boost::program_options;

namespace autoaccum::cli {
Command version_command() {
  Command c;
  c.name = "version";
  c.summary = "Print the versions of autoaccum, LibTorch, BLAS, MPI, HDF5 and NCCL.";
  c.usage = "autoaccum version   (or: autoaccum --version)";
  c.run = [](const po::variables_map&, comm::Communicator& world) {
    if (world.rank() == 0) {
      for (const auto& line : version_lines())
        std::cout << line << "\n";
      std::cout << "world     " << world.size() << " rank(s)" << std::endl;
    }
    return 0;
  };
  return c;
}

namespace {

std::string general_help(const std::vector<Command>& commands) {
  std::ostringstream out;
  out << "autoaccum: data-parallel training that finds the largest micro-batch every rank can "
         "hold\nand accumulates gradients to exactly the global batch.\n\n"
      << "Usage: autoaccum <command> [options]      (under mpirun or srun)\n"
      << "       autoaccum <command> --help\n       autoaccum --version\n\nCommands:\n";
  for (const auto& c : commands) {
    out << "  " << c.name << std::string(c.name.size() < 10 ? 10 - c.name.size() : 1, ' ')
        << c.summary << "\n";
  }
  out << "\nDocumentation: README.md and docs/ in the autoaccum source tree.\n";
  return out.str();
}

const Command* find(const std::vector<Command>& commands, const std::string& name) {
  for (const auto& c : commands) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

}  // namespace

namespace {
std::string g_command_line;
}

const std::string& command_line() {
  return g_command_line;
}

std::vector<Command> all_commands() {
  std::vector<Command> commands;
  commands.push_back(train_command());
  commands.push_back(log_command());
  commands.push_back(export_command());
  commands.push_back(import_command());
  commands.push_back(synth_command());
  commands.push_back(inspect_command());
  commands.push_back(version_command());
  return commands;
}

bool needs_mpi(const std::vector<std::string>& args) {
  if (args.empty() || args.front() != "train") return false;
  return std::none_of(args.begin(), args.end(),
                      [](const std::string& a) { return a == "--help" || a == "-h"; });
}

int run_app(comm::Communicator& world, const std::vector<std::string>& args) {
  const std::vector<Command> commands = all_commands();
  g_command_line = "autoaccum";
  for (const auto& a : args) {
    const bool plain = a.find_first_of(" \t'\"$*?") == std::string::npos && !a.empty();
    g_command_line += " " + (plain ? a : "'" + a + "'");
  }
  const bool root = world.rank() == 0;

  // The arguments are the same on every rank, so every rank reaches the same verdict here and
  // the errors are collective without any communication.
  auto usage_error = [&](const std::string& message) {
    throw CollectiveError(message, ExitCode::kUsage, 0);
  };
  if (args.empty()) usage_error("no command given (see autoaccum --help)");
  const std::string& first = args.front();
  if (first == "--help" || first == "-h" || (first == "help" && args.size() == 1)) {
    if (root) std::cout << general_help(commands);
    return 0;
  }
  if (first == "help") {
    const Command* c = find(commands, args[1]);
    if (!c) usage_error("help: unknown command '" + args[1] + "' (see autoaccum --help)");
    if (root) std::cout << help_text(*c);
    return 0;
  }
  const std::string name = first == "--version" ? "version" : first;
  const Command* command = find(commands, name);
  if (!command) {
    usage_error("unknown command '" + first + "' (see autoaccum --help for the list)");
  }

  po::variables_map options;
  // A config file may be readable on some ranks only; agree before going on.
  comm::collectively(world, [&] {
    options = parse_options(*command, std::vector<std::string>(args.begin() + 1, args.end()));
  });
  if (options.count("help")) {
    if (root) std::cout << help_text(*command);
    return 0;
  }
  return command->run(options, world);
}

}  // namespace autoaccum::cli
