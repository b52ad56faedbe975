// What slab_reader.cpp and documents.cpp share: an open shard, and how messages name a dataset.
// Private to src/data.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace autoaccum::data
