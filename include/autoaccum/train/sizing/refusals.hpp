// A size the model refuses: its own error (LibTorch's or its TorchScript code's) on a
// micro-batch smaller than one this rank tried before an out-of-memory lowered it, such as
// BatchNorm's one row. That ends the run with one line and exit 3 (sizing's fail_if_refused),
// where any other error is a bug of the model or of autoaccum. Fed by every attempt (step/).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace autoaccum::train {

class Refusals {
 public:
  // An attempt at `m` (a probe's size included) starts.
  void start(std::int64_t m) {
    tried_before_ = largest_;
    largest_ = std::max(largest_, m);
    previous_ = last_;
    last_ = m;
  }
  // Some rank ran out of memory in an agreed outcome.
  void saw_out_of_memory() { ran_out_before_ = true; }
  // The model failed at the attempt's size with `what`: recorded, and true, when that is a
  // refusal (a size below one tried before, after some out-of-memory); false: a failure.
  bool take(const std::string& what, bool from_the_model) {
    if (!(from_the_model && last_ > 0 && last_ < tried_before_ && ran_out_before_)) return false;
    what_ = what;
    refused_after_ = previous_;
    return true;
  }
  std::int64_t size() const { return last_; }  // the last attempt's (a probe's size is not current)
  std::int64_t refused_after() const { return refused_after_; }  // the size tried before it
  const std::string& what() const { return what_; }              // the model's whole error

 private:
  std::int64_t largest_ = 0, last_ = 0, tried_before_ = 0, previous_ = 0, refused_after_ = 0;
  bool ran_out_before_ = false;
  std::string what_;
};

}  // namespace autoaccum::train
