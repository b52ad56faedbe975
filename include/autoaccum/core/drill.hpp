// Drill options (--inject-oom, --inject-slow, --inject-overflow, --inject-stall):
// "key=value,key=value" items, several separated by ';'. One parser, so every drill refuses bad
// input the same way.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "autoaccum/core/error.hpp"

namespace autoaccum::core {

struct DrillItem {
  std::string text;                      // the item as given, for messages
  std::map<std::string, double> values;  // key -> number
  std::int64_t integer(const std::string& key) const {
    return static_cast<std::int64_t>(values.at(key));
  }
};

// Each non-empty item of `text`. UsageError "OPTION: 'ITEM': why (expected FORM)" for a field
// without '=', a value that is not a number, a key not in `keys`, a missing key of `required`,
// or a value of a key in `whole` that is not a whole number >= 0.
std::vector<DrillItem> parse_drill(const std::string& option, const std::string& text,
                                   const std::vector<std::string>& keys,
                                   const std::vector<std::string>& required,
                                   const std::vector<std::string>& whole, const std::string& form);

// --inject-stall rank=R,step=S,seconds=T: rank R stops for T seconds at the start of step S, as
// if its file system or GPU hung (the collective watchdog's drill).
struct StallInjection {
  int rank = 0;
  std::int64_t step = 0;
  double seconds = 0;
};
std::vector<StallInjection> parse_stall_injections(const std::string& text);

// The same message shape for a value the caller finds out of range.
UsageError drill_error(const std::string& option, const DrillItem& item, const std::string& why,
                       const std::string& form);

}  // namespace autoaccum::core
