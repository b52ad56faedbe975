// Checksum: a fast hash of bytes given in pieces (xxHash's XXH3, 64 bits), written as text.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace autoaccum {

// The same bytes give the same text whatever the pieces they come in. The text names the
// algorithm ("xxh3-64:" and 16 hex digits), so a file says how to check it; Python's
// xxhash.xxh3_64_hexdigest gives the same digits.
class Checksum {
 public:
  Checksum();
  ~Checksum();
  Checksum(Checksum&&) noexcept;
  Checksum& operator=(Checksum&&) noexcept;
  Checksum(const Checksum&) = delete;
  Checksum& operator=(const Checksum&) = delete;

  void add(const void* data, std::size_t bytes);
  std::string text() const;  // "xxh3-64:0123456789abcdef"

  static std::string of(const void* data, std::size_t bytes);
  // Whether `text` is a checksum this build can check (its algorithm is known).
  static bool known(const std::string& text);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The HDF5 attribute, on each dataset, that holds its checksum.
inline constexpr const char* kChecksumAttribute = "checksum";

}  // namespace autoaccum
