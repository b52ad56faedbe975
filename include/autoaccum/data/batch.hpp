// Batch: named tensors sharing dimension 0; micro-batches are views into it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace autoaccum::data {

// Whole documents of document data (docs/data-format.md), their tokens concatenated: document
// i of the slab is tokens[offsets[i], offsets[i + 1]). What the model sees is cut from it by a
// micro-batch plan (data/micro_batch_plan.hpp): [m, L] ids padded on the right.
struct Documents {
  enum class Target {
    kNextToken,   // implicit: the next token inside the document; the last position has none
    kPerToken,    // a ragged labels dataset on the same offsets as the tokens
    kPerDocument  // one label per document ([N]): sequence classification
  };
  at::Tensor tokens;  // int64 [offsets.back()]
  at::Tensor labels;  // int64: [offsets.back()] (kPerToken), [documents] (kPerDocument), or none
  std::vector<std::int64_t> offsets;  // [documents + 1], from 0
  Target target = Target::kNextToken;
  bool lengths_input = false;  // --inputs tokens,lengths: the lengths [m] as a second input
  std::int64_t ignore_index = -100;
  std::string target_name = "next token";  // the target field's name in a micro-batch
  std::int64_t count() const noexcept { return static_cast<std::int64_t>(offsets.size()) - 1; }
  std::int64_t length(std::int64_t i) const {
    return offsets[static_cast<std::size_t>(i) + 1] - offsets[static_cast<std::size_t>(i)];
  }
};

class Batch {
 public:
  Batch() = default;

  // Adds a field; every field must have the same number of rows (dimension 0).
  void add(std::string name, at::Tensor tensor);

  std::int64_t rows() const noexcept { return rows_; }
  std::size_t size() const noexcept { return tensors_.size(); }
  bool empty() const noexcept { return tensors_.empty(); }
  const std::vector<std::string>& names() const noexcept { return names_; }
  const at::Tensor& operator[](std::size_t i) const { return tensors_.at(i); }
  const at::Tensor& get(const std::string& name) const;

  // Rows [offset, offset + rows) of every field as views (no copy); `rows` is clipped at the end.
  Batch slice(std::int64_t offset, std::int64_t rows) const;

  // Global row index (in the concatenated shards) of this batch's first row; -1 if unknown.
  std::int64_t first_row = -1;

  // Document data: the slab's documents (rows() counts them; the batch has no fields).
  void set_documents(std::shared_ptr<const Documents> documents);
  const Documents* documents() const noexcept { return documents_.get(); }

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> tensors_;
  std::int64_t rows_ = 0;
  std::shared_ptr<const Documents> documents_;
};

}  // namespace autoaccum::data
