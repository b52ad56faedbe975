// Batch: the row invariant and zero-copy slicing.
#include "autoaccum/data/batch.hpp"

#include <algorithm>

#include "autoaccum/core/error.hpp"

namespace autoaccum::data {

void Batch::add(std::string name, at::Tensor tensor) {
  if (!tensor.defined() || tensor.dim() == 0) {
    throw Error("Batch::add: field '" + name + "' needs at least one dimension");
  }
  if (!tensors_.empty() && tensor.size(0) != rows_) {
    throw Error("Batch::add: field '" + name + "' has " + std::to_string(tensor.size(0)) +
                " rows but the batch has " + std::to_string(rows_));
  }
  rows_ = tensor.size(0);
  names_.push_back(std::move(name));
  tensors_.push_back(std::move(tensor));
}

const at::Tensor& Batch::get(const std::string& name) const {
  const auto it = std::find(names_.begin(), names_.end(), name);
  if (it == names_.end()) throw Error("Batch: no field '" + name + "'");
  return tensors_[static_cast<std::size_t>(it - names_.begin())];
}

void Batch::set_documents(std::shared_ptr<const Documents> documents) {
  if (!tensors_.empty()) throw Error("Batch::set_documents: the batch already has fields");
  rows_ = documents ? documents->count() : 0;
  documents_ = std::move(documents);
}

Batch Batch::slice(std::int64_t offset, std::int64_t rows) const {
  if (documents_) throw Error("Batch::slice: documents are cut by a micro-batch plan");
  if (offset < 0 || offset > rows_ || rows < 0) {
    throw Error("Batch::slice: rows [" + std::to_string(offset) + ", +" + std::to_string(rows) +
                ") outside a batch of " + std::to_string(rows_));
  }
  const std::int64_t length = std::min(rows, rows_ - offset);
  Batch view;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    view.add(names_[i], tensors_[i].narrow(0, offset, length));
  }
  view.rows_ = length;
  view.first_row = first_row < 0 ? -1 : first_row + offset;
  return view;
}

}  // namespace autoaccum::data
