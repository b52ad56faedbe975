// Importers that write autoaccum training files: Fashion-MNIST from IDX files, text (byte
// windows or documents), synthetic data. Each dataset carries its checksum (core/checksum.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace autoaccum::data {

// The decoded contents of one gzip-compressed IDX file (unsigned byte data only).
struct IdxArray {
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> values;
};

// Reads a gzip-compressed (or plain) IDX file of unsigned bytes; checks the magic number
// (0x0000 08 NDIMS) and that the data length matches the header. InputError names the file.
IdxArray read_idx(const std::string& path);

// Writes fashion-mnist-train.h5 and fashion-mnist-test.h5 into `out_dir` from the IDX files in
// `source_dir` (train-images-idx3-ubyte.gz, ...): x uint8 [N, 1, 28, 28], y int64 [N],
// num_classes = 10, class_names. Each file is written to a temporary name and renamed.
// Returns the paths written.
std::vector<std::string> import_fashion_mnist(const std::string& source_dir,
                                              const std::string& out_dir);

struct TextOptions {
  std::vector<std::string> sources;  // files, or folders whose plain files are read
  std::string out_dir;
  std::int64_t context = 128;         // tokens per window (T)
  double validation_fraction = 0.05;  // the held-out tail
  // Documents instead of windows: "" (windows), "file", "fortune" (entries between lines
  // holding only %), or "paragraph" (text between blank lines).
  std::string documents;
  std::int64_t max_length = 0;  // documents: longer ones are split into pieces of at most this
};
struct TextImport {
  std::vector<std::string> paths;  // text-train.h5, text-val.h5
  std::int64_t bytes = 0;          // the corpus
  std::int64_t train_rows = 0, val_rows = 0;
};

// Byte-level language-model files from text: the sources (in name order, a folder's regular
// files only: Debian's fortunes folder also holds .dat indexes and .u8 links, which are
// skipped) are concatenated into one byte stream; window i is x = bytes [iT, iT + T) and
// y = bytes [iT + 1, iT + T + 1) (the next byte at every position), both int64 [N, T] with
// num_classes = 256. The last `validation_fraction` of the windows go to text-val.h5. Each file
// is written to a temporary name and renamed. InputError for a missing source or a corpus
// shorter than two windows.
TextImport import_text(const TextOptions& options);

// Document data from text (docs/data-format.md): each source file is cut into documents
// (options.documents), empty ones (only white space) dropped, longer than max_length split into
// consecutive pieces; tokens uint8 (encoding = integer) and offsets int64, num_classes = 256,
// into text-docs-train.h5 and text-docs-val.h5 (the last validation_fraction of the
// documents, at least one). train_rows and val_rows count documents.
TextImport import_text_documents(const TextOptions& options);

struct SynthOptions {
  std::string out;
  std::int64_t rows = 0;
  std::int64_t features = 0;
  std::int64_t classes = 0;
  std::uint64_t seed = 0;
  double noise = 1.0;                   // standard deviation around each class centre
  std::int64_t rows_per_write = 65536;  // bounds memory: a file larger than RAM can be made
};

// A learnable classification set, deterministic from the seed: each class has a random centre
// (standard normal, scaled by 2), and each row is its class centre plus Gaussian noise.
// x float32 [rows, features], y int64 [rows], num_classes; written in pieces of
// rows_per_write rows to a temporary name, then renamed.
void write_synthetic(const SynthOptions& options);

}  // namespace autoaccum::data
