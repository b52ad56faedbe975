// Option parsing shared by all subcommands: one-line errors that name the option.
#include "autoaccum/cli/command.hpp"

#include <fstream>
#include <sstream>

#include "autoaccum/core/error.hpp"

namespace po = boost::program_options;

namespace autoaccum::cli {
namespace {

po::options_description full_options(const Command& command) {
  po::options_description all(command.options);
  po::options_description common("Common options", 100);
  common.add_options()("help,h", "show this help and exit");
  if (command.accepts_config) {
    common.add_options()("config", po::value<std::string>()->value_name("FILE"),
                         "read options from an INI file (command-line options win)");
  }
  all.add(common);
  return all;
}

// The config file's text with a section for this command ([train] for `autoaccum train`, or
// [autoaccum]) unwrapped: its options read as if at the top. Another section is an error naming
// it, not Boost's "unrecognised option 'other.name'".
std::string unwrap_sections(std::istream& in, const std::string& command,
                            const std::string& where) {
  std::ostringstream out;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const auto first = line.find_first_not_of(" \t");
    const auto last = line.find_last_not_of(" \t\r");
    if (first != std::string::npos && line[first] == '[' && line[last] == ']') {
      const std::string section = line.substr(first + 1, last - first - 1);
      if (section != command && section != "autoaccum") {
        throw UsageError(where + ", line " + std::to_string(number) + ": section [" + section +
                         "]: options for autoaccum " + command +
                         " go at the top of the file or "
                         "under [" +
                         command + "]");
      }
      out << "\n";  // keeps line numbers in Boost's messages
      continue;
    }
    out << line << "\n";
  }
  return out.str();
}

}  // namespace

po::variables_map parse_options(const Command& command, const std::vector<std::string>& args) {
  const po::options_description all = full_options(command);
  const std::string where = "autoaccum " + command.name;
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(command.positional).run(), vm);
    if (vm.count("help")) return vm;  // --help wins over missing required options
    if (command.accepts_config && vm.count("config")) {
      const std::string file = vm["config"].as<std::string>();
      std::ifstream in(file);
      if (!in) throw UsageError(where + ": --config: cannot read '" + file + "'");
      try {
        std::istringstream text(
            unwrap_sections(in, command.name, where + ": --config '" + file + "'"));
        po::store(po::parse_config_file(text, command.options), vm);
      } catch (const po::error& e) {
        throw UsageError(where + ": --config '" + file + "': " + e.what());
      }
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(where + ": " + e.what() + " (see " + where + " --help)");
  }
  return vm;
}

std::string help_text(const Command& command) {
  std::ostringstream out;
  out << "Usage: " << command.usage << "\n\n" << command.summary << "\n\n" << full_options(command);
  return out.str();
}

}  // namespace autoaccum::cli
