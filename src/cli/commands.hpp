// The subcommands, one factory each (private to the cli module).
#pragma once

#include <string>
#include <vector>

#include "autoaccum/cli/command.hpp"

namespace autoaccum::cli {

Command version_command();
Command import_command();
Command synth_command();
Command inspect_command();
Command train_command();
Command log_command();
Command export_command();

// "autoaccum ARGS..." as typed, for the run log (set by run_app).
const std::string& command_line();

// "a,b" -> {"a", "b"}; empty items are dropped.
std::vector<std::string> split_list(const std::string& text);

}  // namespace autoaccum::cli
