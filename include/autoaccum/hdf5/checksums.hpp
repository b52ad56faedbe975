// Checksums of HDF5 objects: a dataset's bytes, and a file's root attributes.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autoaccum/hdf5/hdf5.hpp"

namespace autoaccum::hdf5 {

std::int64_t element_bytes(DType type);  // 0 for kOther

// The checksum (core/checksum.hpp) of a dataset's elements in their own type, as memory holds
// them, read in pieces of about 64 MiB whatever the file's chunking or filters; `progress` is
// called with the bytes read so far after each piece. Nothing for a type autoaccum does not read
// (strings, compounds).
std::optional<std::string> data_checksum(const Dataset& dataset,
                                         const std::function<void(std::int64_t)>& progress = {});

// The checksum of every root attribute but the root's own `checksum` (names in order, each with
// its kind and value), so that a changed attribute (a checkpoint's step, its tensor names) is
// found as a changed dataset is.
std::string attributes_checksum(const File& file);

// Creates the dataset `name` (contiguous), writes all its rows from `data` (elements of `type`)
// and stores the checksum of those bytes beside it.
Dataset write_with_checksum(File& file, const std::string& name, DType type,
                            const std::vector<std::int64_t>& shape, const void* data);

// What verify_checksum found.
enum class Verdict { kVerified, kNoChecksum, kDamaged, kUnknownAlgorithm };

// Compares the dataset's stored `checksum` attribute with `actual` (a checksum of the bytes just
// read, or data_checksum's).
Verdict verify_checksum(const Dataset& dataset, const std::string& actual);

}  // namespace autoaccum::hdf5
