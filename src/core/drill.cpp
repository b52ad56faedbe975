// parse_drill: the one parser of the drill options.
#include "autoaccum/core/drill.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace autoaccum::core {

UsageError drill_error(const std::string& option, const DrillItem& item, const std::string& why,
                       const std::string& form) {
  return UsageError(option + ": '" + item.text + "': " + why + " (expected " + form + ")");
}

std::vector<DrillItem> parse_drill(const std::string& option, const std::string& text,
                                   const std::vector<std::string>& keys,
                                   const std::vector<std::string>& required,
                                   const std::vector<std::string>& whole, const std::string& form) {
  const auto listed = [](const std::vector<std::string>& list, const std::string& key) {
    return std::find(list.begin(), list.end(), key) != list.end();
  };
  std::vector<DrillItem> items;
  std::stringstream list(text);
  for (std::string one; std::getline(list, one, ';');) {
    if (one.empty()) continue;
    DrillItem item;
    item.text = one;
    const auto bad = [&](const std::string& why) { return drill_error(option, item, why, form); };
    std::stringstream fields(one);
    for (std::string field; std::getline(fields, field, ',');) {
      const auto eq = field.find('=');
      if (eq == std::string::npos) throw bad("'" + field + "' has no '='");
      const std::string key = field.substr(0, eq), value = field.substr(eq + 1);
      if (!listed(keys, key)) throw bad("unknown key '" + key + "'");
      double number = 0;
      try {
        std::size_t used = 0;
        number = std::stod(value, &used);
        if (used != value.size()) throw std::invalid_argument("trailing");
      } catch (const std::logic_error&) {  // not a number, trailing text, or out of range
        throw bad("'" + value + "' is not a number");
      }
      if (listed(whole, key) && (number < 0 || number != std::floor(number)))
        throw bad(key + " must be a whole number >= 0");
      item.values[key] = number;
    }
    for (const auto& key : required) {
      if (!item.values.count(key)) throw bad(key + " is missing");
    }
    items.push_back(std::move(item));
  }
  return items;
}

std::vector<StallInjection> parse_stall_injections(const std::string& text) {
  const std::string form = "rank=R,step=S,seconds=T";
  std::vector<StallInjection> all;
  for (const auto& item : parse_drill("--inject-stall", text, {"rank", "step", "seconds"},
                                      {"rank", "step", "seconds"}, {"rank", "step"}, form)) {
    StallInjection stall;
    stall.rank = static_cast<int>(item.integer("rank"));
    stall.step = item.integer("step");
    stall.seconds = item.values.at("seconds");
    if (!(stall.seconds >= 0) || !std::isfinite(stall.seconds))
      throw drill_error("--inject-stall", item, "seconds must be a number >= 0", form);
    all.push_back(stall);
  }
  return all;
}

}  // namespace autoaccum::core
