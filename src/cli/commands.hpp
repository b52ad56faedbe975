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

// "a,b" -> {"a", "b"}; empty items are dropped.
std::vector<std::string> split_list(const std::string& text);

}  // namespace autoaccum::cli
