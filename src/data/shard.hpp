// What slab_reader.cpp and documents.cpp share: an open shard, and how messages name a dataset.
// Private to src/data.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "autoaccum/core/error.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/hdf5/hdf5.hpp"

namespace autoaccum::data {

struct SlabReader::Shard {
  hdf5::File file;
  // Parallel to schema_.fields; document data: tokens, then the labels if any.
  std::vector<hdf5::Dataset> datasets;
  std::int64_t rows = 0;
  // For contiguous, unfiltered, native-typed datasets: the data's byte offset, read with
  // pread(2) on `descriptor`, which skips HDF5's per-call selection work (it dominates slabs of
  // a few hundred KiB). -1: read through HDF5.
  std::vector<std::int64_t> raw_offsets;
  int descriptor = -1;
  std::vector<std::int64_t> offsets;  // document data: the shard's `offsets`, read at open
  ~Shard() {
    if (descriptor >= 0) ::close(descriptor);
  }
};

// "'file', dataset 'name'": how every message names a dataset.
inline std::string where(const std::string& file, const std::string& dataset) {
  return "'" + file + "', dataset '" + dataset + "'";
}

// A shard's num_classes attribute, if it has one, checked against the shards before it.
inline void read_declared_classes(const hdf5::File& file, const std::string& path,
                                  SlabReader::DeclaredClasses& declared) {
  if (!file.has_attribute("num_classes")) return;
  const std::int64_t classes = file.read_int_attribute("num_classes");
  if (classes < 1)
    throw InputError("'" + path + "': attribute num_classes is " + std::to_string(classes));
  if (declared.classes && *declared.classes != classes) {
    throw InputError("'" + path + "' says num_classes = " + std::to_string(classes) + " but '" +
                     declared.in + "' says " + std::to_string(*declared.classes));
  }
  declared.classes = classes;
  declared.in = path;
}

}  // namespace autoaccum::data
