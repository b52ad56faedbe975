// Fingerprint: FNV-1a, 64 bits, of bytes given in pieces: enough to tell one data file (or one
// replica's parameters) from another of the same shape. Checkpoints store its text, so it never
// changes algorithm (core/checksum.hpp is the hash that checks files).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace autoaccum {

struct Fingerprint {
  std::uint64_t value = 14695981039346656037ull;
  void add(const void* data, std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < bytes; ++i)
      value = (value ^ p[i]) * 1099511628211ull;
  }
  void add(const std::string& text) { add(text.data(), text.size()); }
  void add(std::int64_t number) { add(&number, sizeof number); }
  std::string hex() const {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
    return text;
  }
};

}  // namespace autoaccum
