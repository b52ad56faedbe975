// Option parsing: errors name the command and the option; config files; help text.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "autoaccum/cli/command.hpp"
#include "autoaccum/core/error.hpp"

namespace po = boost::program_options;

namespace autoaccum::cli {
namespace {

Command example() {
  Command c;
  c.name = "example";
  c.summary = "An example command.";
  c.usage = "autoaccum example [options] FILE";
  c.accepts_config = true;
  c.options.add_options()("steps", po::value<int>()->default_value(10), "number of steps")(
      "lr", po::value<double>()->required(), "learning rate")("file", po::value<std::string>(),
                                                              "input file");
  c.positional.add("file", 1);
  return c;
}

std::string usage_error_of(const std::vector<std::string>& args) {
  try {
    parse_options(example(), args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(Options, ParsesValuesAndPositional) {
  auto vm = parse_options(example(), {"--lr", "0.5", "data.h5"});
  EXPECT_DOUBLE_EQ(vm["lr"].as<double>(), 0.5);
  EXPECT_EQ(vm["steps"].as<int>(), 10);
  EXPECT_EQ(vm["file"].as<std::string>(), "data.h5");
}

TEST(Options, UnknownOptionNamesOptionAndCommand) {
  const std::string message = usage_error_of({"--lr", "1", "--bogus"});
  EXPECT_NE(message.find("--bogus"), std::string::npos) << message;
  EXPECT_NE(message.find("autoaccum example"), std::string::npos) << message;
}

TEST(Options, BadValueNamesOption) {
  const std::string message = usage_error_of({"--lr", "fast"});
  EXPECT_NE(message.find("lr"), std::string::npos) << message;
  EXPECT_NE(message.find("fast"), std::string::npos) << message;
}

TEST(Options, MissingRequiredOptionIsAnError) {
  const std::string message = usage_error_of({"--steps", "3"});
  EXPECT_NE(message.find("lr"), std::string::npos) << message;
}

TEST(Options, HelpWinsOverMissingRequiredOption) {
  auto vm = parse_options(example(), {"--help"});
  EXPECT_EQ(vm.count("help"), 1u);
}

TEST(Options, ConfigFileSuppliesOptionsAndCommandLineWins) {
  const std::string path = testing::TempDir() + "/autoaccum_options_test.ini";
  {
    std::ofstream out(path);
    out << "# comment\nlr = 0.25\nsteps = 7\n";
  }
  auto vm = parse_options(example(), {"--config", path, "--steps", "3"});
  EXPECT_DOUBLE_EQ(vm["lr"].as<double>(), 0.25);
  EXPECT_EQ(vm["steps"].as<int>(), 3);
  std::remove(path.c_str());
}

TEST(Options, UnreadableConfigFileIsNamed) {
  const std::string message = usage_error_of({"--config", "/nonexistent/dir/run.ini"});
  EXPECT_NE(message.find("/nonexistent/dir/run.ini"), std::string::npos) << message;
  EXPECT_NE(message.find("--config"), std::string::npos) << message;
}

TEST(Options, UnknownKeyInConfigFileIsNamed) {
  const std::string path = testing::TempDir() + "/autoaccum_options_bad.ini";
  {
    std::ofstream out(path);
    out << "lr = 1\nwarp_speed = 9\n";
  }
  const std::string message = usage_error_of({"--config", path});
  EXPECT_NE(message.find("warp_speed"), std::string::npos) << message;
  EXPECT_NE(message.find(path), std::string::npos) << message;
  std::remove(path.c_str());
}

TEST(Options, HelpTextShowsUsageAndOptions) {
  const std::string text = help_text(example());
  EXPECT_NE(text.find("autoaccum example [options] FILE"), std::string::npos);
  EXPECT_NE(text.find("--steps"), std::string::npos);
  EXPECT_NE(text.find("--config"), std::string::npos);
  EXPECT_NE(text.find("--help"), std::string::npos);
}

}  // namespace
}  // namespace autoaccum::cli
