// Checksum over xxHash's streaming XXH3 (64 bits): several GB/s a core, so checking a checkpoint
// costs little next to reading it.
#include "autoaccum/core/checksum.hpp"

#include <xxhash.h>

#include <cstdio>
#include <new>

namespace autoaccum {

namespace {
constexpr const char* kPrefix = "xxh3-64:";
}

struct Checksum::State {
  XXH3_state_t* xxh = nullptr;
  State() : xxh(XXH3_createState()) {
    if (xxh == nullptr || XXH3_64bits_reset(xxh) != XXH_OK) throw std::bad_alloc();
  }
  ~State() { XXH3_freeState(xxh); }
  State(const State&) = delete;
  State& operator=(const State&) = delete;
};

Checksum::Checksum() : state_(std::make_unique<State>()) {}
Checksum::~Checksum() = default;
Checksum::Checksum(Checksum&&) noexcept = default;
Checksum& Checksum::operator=(Checksum&&) noexcept = default;

void Checksum::add(const void* data, std::size_t bytes) {
  if (bytes > 0) XXH3_64bits_update(state_->xxh, data, bytes);
}

std::string Checksum::text() const {
  char digits[17];
  std::snprintf(digits, sizeof digits, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits_digest(state_->xxh)));
  return std::string(kPrefix) + digits;
}

std::string Checksum::of(const void* data, std::size_t bytes) {
  Checksum sum;
  sum.add(data, bytes);
  return sum.text();
}

bool Checksum::known(const std::string& text) {
  return text.size() == 8 + 16 && text.compare(0, 8, kPrefix) == 0;
}

}  // namespace autoaccum
