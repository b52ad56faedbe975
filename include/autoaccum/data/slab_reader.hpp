// SlabReader: a training set of one or more HDF5 shard files, read as contiguous row slabs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autoaccum/data/batch.hpp"

namespace autoaccum::data {

enum class FieldType { kUInt8, kInt64, kFloat32 };
std::string to_string(FieldType type);
// "[1, 28, 28]": a shape as messages show it.
std::string shape_text(const std::vector<std::int64_t>& shape);

// One dataset of the training file: name, element type in the file, shape of one row.
struct FieldSpec {
  std::string name;
  FieldType type;
  std::vector<std::int64_t> row_shape;
  bool is_target = false;
  // The type stored in the file ("uint8", "int32", ...): differs from `type` for int32 and for
  // uint8 token ids (encoding = "integer"), both read as int64.
  std::string stored_type;
};

struct DataSchema {
  std::vector<FieldSpec> fields;  // the inputs in --inputs order, then the target
  std::int64_t rows = 0;          // over all shards
  // Classes for integer targets: the `num_classes` attribute, or max label + 1.
  std::optional<std::int64_t> num_classes;
  // The largest label, when the labels were read (integer targets, checked at open).
  std::optional<std::int64_t> max_label;
  const FieldSpec& target() const { return fields.back(); }

  // Document data (a 1-D `tokens` and an int64 `offsets` dataset, docs/data-format.md): rows are
  // documents of every length. The token input and a per-token target have row shape [-1].
  bool documents = false;
  std::vector<std::int64_t> lengths;  // every document's length in tokens, over all shards
  std::int64_t tokens = 0;            // their sum
  std::int64_t max_length = 0;        // the longest document
  // "1000 documents, 51234 tokens; length min 3, p50 40, p90 120, p99 300, max 512"
  std::string describe_documents() const;
  // One line per field, e.g. "x uint8 [60000, 1, 28, 28] (input)".
  std::string describe() const;
};

// Expands each argument of --data: a glob (with *, ? or [) becomes its matches in name order;
// a plain path stays as given. A glob that matches nothing is an InputError naming it.
// `option` names the argument in messages.
std::vector<std::string> expand_data_paths(const std::vector<std::string>& arguments,
                                           const std::string& option = "--data");

// Document data is recognised by its datasets `tokens` and `offsets`. --inputs is then `tokens`
// (the default `x` means it) or `tokens,lengths`; --targets is the next token (the default `y`
// when the file has no `y`, or `next`), a labels dataset on the tokens' offsets (one label per
// token), or one of [documents] labels (one per document). read() returns the documents whole
// (Batch::documents()); the micro-batch plan pads them.
class SlabReader {
 public:
  // Opens every shard and checks the schema: the named datasets exist in every shard with the
  // same types and row shapes; inputs and target have equal lengths; input types are uint8
  // (images, scaled), int64 (token ids, unscaled) or float32, the target int64 (class labels,
  // [rows] or one per token [rows, T]) or float32; there is at least one row; integer labels
  // other than `ignore_label` lie in [0, num_classes). Each problem is an InputError that names
  // the file and dataset.
  SlabReader(std::vector<std::string> paths, std::vector<std::string> inputs, std::string target,
             bool check_labels = true, std::int64_t ignore_label = -100);
  ~SlabReader();
  SlabReader(SlabReader&&) noexcept;
  SlabReader& operator=(SlabReader&&) noexcept;

  const DataSchema& schema() const noexcept { return schema_; }
  const std::vector<std::string>& paths() const noexcept { return paths_; }
  // Rows in each shard, in order.
  std::vector<std::int64_t> shard_rows() const;
  // The datasets stored compressed (an HDF5 filter): every slab read decompresses them on the
  // training process's own cores. "'x' in a.h5 (chunks of 1 row)", one per dataset and shard.
  std::vector<std::string> compressed_datasets() const;

  // Rows [begin, end) of every field: one hyperslab read per dataset and shard touched, straight
  // into the tensor's memory. uint8 inputs become float32 in [0, 1] (x / 255); int64 and float32
  // keep their type. Safe to call from one background thread while the main thread trains.
  Batch read(std::int64_t begin, std::int64_t end) const;

  // Slabs in page-locked (pinned) host memory, so micro-batches copy to a GPU asynchronously.
  // Needs a CUDA LibTorch and a GPU; set before the first read.
  void set_pinned(bool pinned) noexcept { pinned_ = pinned; }

  // num_classes as the shards declare it, and the first file that did (private to src/data).
  struct DeclaredClasses {
    std::optional<std::int64_t> classes;
    std::string in;
  };

 private:
  struct Shard;
  void open_shard(const std::string& path, const std::vector<std::string>& names,
                  DeclaredClasses& declared);
  std::int64_t largest_label(const std::string& target,
                             std::optional<std::int64_t> declared_classes,
                             std::int64_t ignore_label) const;
  void open_documents(std::vector<std::string> inputs, std::string target, bool check_labels,
                      std::int64_t ignore_label);
  // One shard of documents; `kind` and `target_type` are the first shard's, which it must match.
  void open_document_shard(const std::string& path, const std::string& target,
                           DeclaredClasses& declared, std::optional<Documents::Target>& kind,
                           std::string& target_type);
  // Token ids and labels checked once, up front; returns the largest (the next token's or the
  // labels').
  std::int64_t check_document_ids(const std::string& target, const DeclaredClasses& declared,
                                  bool check_labels, std::int64_t ignore_label) const;
  Batch read_documents(std::int64_t begin, std::int64_t end) const;
  std::vector<std::string> paths_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<std::int64_t> shard_first_row_;  // global index of each shard's first row
  DataSchema schema_;
  bool pinned_ = false;
  Documents layout_;  // document data: how read() describes its documents (no tensors)
};

}  // namespace autoaccum::data
