// Command: one `autoaccum <name>` subcommand, its options and what it runs.
#pragma once

#include <boost/program_options.hpp>
#include <functional>
#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"

namespace autoaccum::cli {

struct Command {
  std::string name;
  std::string summary;  // one line, for `autoaccum --help`
  std::string usage;    // e.g. "autoaccum inspect FILE"
  boost::program_options::options_description options{"Options", 100};
  boost::program_options::positional_options_description positional;
  // Whether `--config FILE` (INI, same option names) is accepted.
  bool accepts_config = false;
  std::function<int(const boost::program_options::variables_map&, comm::Communicator&)> run;
};

// Every subcommand, in the order `--help` lists them.
std::vector<Command> all_commands();

// Parses `args` (after the subcommand name) for `command`. `--help` is added to every command.
// Throws UsageError naming the option and the command on any problem. An option given on the
// command line wins over the same option in the config file.
boost::program_options::variables_map parse_options(const Command& command,
                                                    const std::vector<std::string>& args);

// Text of `autoaccum <command> --help`.
std::string help_text(const Command& command);

}  // namespace autoaccum::cli
