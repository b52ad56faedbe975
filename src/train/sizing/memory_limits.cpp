#include "autoaccum/train/sizing/memory_limits.hpp"

#include <algorithm>
#include <utility>

#include "autoaccum/comm/communicator.hpp"
#include "autoaccum/memory/memory.hpp"

namespace autoaccum::train {
namespace {

std::string size_or_none(std::int64_t bytes) {
  return bytes > 0 ? memory::format_bytes(bytes) : std::string("none");
}

}  // namespace

MemoryLimits::MemoryLimits(std::int64_t limit, std::vector<std::int64_t> list)
    : limit_(limit), list_(std::move(list)) {}

std::int64_t MemoryLimits::given(int rank) const {
  return list_.empty() ? limit_ : list_[static_cast<std::size_t>(rank) % list_.size()];
}

void MemoryLimits::gather(comm::Communicator& comm, std::int64_t mine) {
  gathered_.assign(static_cast<std::size_t>(comm.size()), 0);
  comm.allgather(&mine, sizeof(mine), gathered_.data());
}

std::int64_t MemoryLimits::of(int rank) const {
  const auto i = static_cast<std::size_t>(rank);
  return i < gathered_.size() ? gathered_[i] : 0;
}

bool MemoryLimits::known() const {
  return std::any_of(gathered_.begin(), gathered_.end(), [](std::int64_t l) { return l > 0; });
}

std::string MemoryLimits::option_text() const {
  if (list_.empty()) return size_or_none(limit_);
  std::string text;
  for (std::size_t i = 0; i < list_.size(); ++i)
    text += (i ? ", " : "") + size_or_none(list_[i]);
  return text + " (rank i: item i mod " + std::to_string(list_.size()) + ")";
}

std::string MemoryLimits::text(const std::vector<int>& ranks) const {
  if (list_.empty())
    return limit_ > 0 ? memory::format_bytes(limit_) + " per rank"
                      : std::string("no --memory-limit");
  std::string text;
  for (std::size_t i = 0; i < ranks.size(); ++i)
    text +=
        (i ? ", " : "") + size_or_none(given(ranks[i])) + " on rank " + std::to_string(ranks[i]);
  return text;
}

}  // namespace autoaccum::train
