// Checksums of datasets (read back in pieces) and of a file's root attributes.
#include "autoaccum/hdf5/checksums.hpp"

#include <algorithm>
#include <vector>

#include "autoaccum/core/checksum.hpp"

namespace autoaccum::hdf5 {
namespace {

constexpr std::int64_t kPieceBytes = std::int64_t{64} << 20;

void add_text(Checksum& sum, const std::string& text) {
  const auto size = static_cast<std::uint64_t>(text.size());
  sum.add(&size, sizeof size);
  sum.add(text.data(), text.size());
}

}  // namespace

std::int64_t element_bytes(DType type) {
  switch (type) {
    case DType::kUInt8:
      return 1;
    case DType::kUInt16:
      return 2;
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kFloat64:
      return 8;
    case DType::kOther:
      break;
  }
  return 0;
}

std::optional<std::string> data_checksum(const Dataset& dataset,
                                         const std::function<void(std::int64_t)>& progress) {
  const DType type = dataset.dtype();
  const std::int64_t element = element_bytes(type);
  if (element == 0) return std::nullopt;
  const auto shape = dataset.shape();
  Checksum sum;
  if (shape.empty() || shape[0] == 0) return sum.text();
  std::int64_t row_elements = 1;
  for (std::size_t i = 1; i < shape.size(); ++i)
    row_elements *= shape[i];
  const std::int64_t row_bytes = std::max<std::int64_t>(1, row_elements * element);
  const std::int64_t step = std::max<std::int64_t>(1, kPieceBytes / row_bytes);
  std::vector<unsigned char> piece(
      static_cast<std::size_t>(std::min(step, shape[0]) * row_elements * element));
  std::int64_t done = 0;
  for (std::int64_t first = 0; first < shape[0]; first += step) {
    const std::int64_t rows = std::min(step, shape[0] - first);
    const auto bytes = static_cast<std::size_t>(rows * row_elements * element);
    if (bytes > 0) dataset.read_rows(first, rows, type, piece.data());
    sum.add(piece.data(), bytes);
    done += static_cast<std::int64_t>(bytes);
    if (progress) progress(done);
  }
  return sum.text();
}

std::string attributes_checksum(const File& file) {
  std::vector<std::string> names = file.attribute_names();
  std::sort(names.begin(), names.end());
  Checksum sum;
  for (const auto& name : names) {
    if (name == kChecksumAttribute) continue;
    add_text(sum, name);
    const AttributeValue value = file.attribute_value(name);
    const auto kind = static_cast<std::uint8_t>(value.index());
    sum.add(&kind, 1);
    if (const auto* integer = std::get_if<std::int64_t>(&value)) {
      sum.add(integer, sizeof *integer);
    } else if (const auto* real = std::get_if<double>(&value)) {
      sum.add(real, sizeof *real);
    } else if (const auto* text = std::get_if<std::string>(&value)) {
      add_text(sum, *text);
    } else {
      const auto& list = std::get<std::vector<std::string>>(value);
      const auto count = static_cast<std::uint64_t>(list.size());
      sum.add(&count, sizeof count);
      for (const auto& item : list)
        add_text(sum, item);
    }
  }
  return sum.text();
}

Dataset write_with_checksum(File& file, const std::string& name, DType type,
                            const std::vector<std::int64_t>& shape, const void* data) {
  Dataset dataset = file.create_dataset(name, type, shape);
  std::int64_t bytes = element_bytes(type);
  for (const auto dim : shape)
    bytes *= dim;
  if (!shape.empty() && shape[0] > 0) dataset.write_rows(0, shape[0], type, data);
  dataset.write_attribute(kChecksumAttribute, Checksum::of(data, static_cast<std::size_t>(bytes)));
  return dataset;
}

Verdict verify_checksum(const Dataset& dataset, const std::string& actual) {
  const std::optional<std::string> stored = dataset.string_attribute(kChecksumAttribute);
  if (!stored) return Verdict::kNoChecksum;
  if (!Checksum::known(*stored)) return Verdict::kUnknownAlgorithm;
  return *stored == actual ? Verdict::kVerified : Verdict::kDamaged;
}

}  // namespace autoaccum::hdf5
