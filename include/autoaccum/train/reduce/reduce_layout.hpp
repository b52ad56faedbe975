// ReduceLayout: the one all-reduced buffer of a step, as named regions that components register.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace autoaccum::train {

// What an attempt at a step reduces lives in one float32 buffer of named regions: the gradients,
// the control values every rank contributes (out-of-memory flags, peaks, loss, stop), the changes
// of the model's buffers (BatchNorm statistics). A later feature adds a region, not another
// collective. The reducer decides how it travels (reducer.hpp): one all-reduce after the last
// backward pass, buckets all-reduced during it (--overlap), or one reduce-scatter whose every
// chunk carries the regions besides the gradients (--shard optimizer); every rank reads the
// control region once the attempt's last collective is done.
class ReduceLayout {
 public:
  struct Region {
    std::string name;
    std::int64_t offset = 0;  // in floats from the start of the buffer
    std::int64_t count = 0;
  };
  using Handle = std::size_t;

  // Appends a region of `count` floats (0 is allowed); names are unique (std::logic_error).
  Handle add(const std::string& name, std::int64_t count);
  const Region& operator[](Handle handle) const { return regions_.at(handle); }
  const Region* find(const std::string& name) const;
  const std::vector<Region>& regions() const noexcept { return regions_; }
  std::int64_t size() const noexcept { return size_; }  // floats in all

 private:
  std::vector<Region> regions_;
  std::int64_t size_ = 0;
};

}  // namespace autoaccum::train
