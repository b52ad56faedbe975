// ReduceLayout: regions appended back to back.
#include "autoaccum/train/reduce/reduce_layout.hpp"

#include <sstream>
#include <stdexcept>

namespace autoaccum::train {

ReduceLayout::Handle ReduceLayout::add(const std::string& name, std::int64_t count) {
  if (count < 0) throw std::logic_error("reduce layout: region '" + name + "' has a negative size");
  if (find(name)) throw std::logic_error("reduce layout: region '" + name + "' added twice");
  regions_.push_back(Region{name, size_, count});
  size_ += count;
  return regions_.size() - 1;
}

const ReduceLayout::Region* ReduceLayout::find(const std::string& name) const {
  for (const auto& region : regions_) {
    if (region.name == name) return &region;
  }
  return nullptr;
}

}  // namespace autoaccum::train
