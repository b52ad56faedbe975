// Document data (tokens + offsets): the layout's checks at open, and a share's documents read
// as one contiguous slab of tokens (docs/data-format.md, "Documents").
#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <sstream>

#include "autoaccum/core/error.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/hdf5/hdf5.hpp"
#include "shard.hpp"

namespace autoaccum::data {

namespace {

bool integer_type(hdf5::DType type) {
  return type == hdf5::DType::kUInt8 || type == hdf5::DType::kUInt16 ||
         type == hdf5::DType::kInt32 || type == hdf5::DType::kInt64;
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& n : names)
    text += (text.empty() ? "" : ",") + n;
  return text;
}

// Calls `fn(position, value)` for every value of a 1-D integer dataset, read in blocks.
template <class Fn>
void scan_integers(const hdf5::Dataset& dataset, std::int64_t count, Fn&& fn) {
  const std::int64_t block = 1 << 20;
  std::vector<std::int64_t> values;
  for (std::int64_t first = 0; first < count; first += block) {
    const std::int64_t n = std::min(block, count - first);
    values.resize(static_cast<std::size_t>(n));
    dataset.read_rows(first, n, hdf5::DType::kInt64, values.data());
    for (std::int64_t k = 0; k < n; ++k)
      fn(first + k, values[static_cast<std::size_t>(k)]);
  }
}

// The tokens dataset: 1-D integer ids.
void check_token_dataset(const hdf5::Dataset& tokens, const std::string& path) {
  const auto token_shape = tokens.shape();
  if (token_shape.size() != 1)
    throw InputError(where(path, "tokens") + " has shape " + shape_text(token_shape) +
                     "; document tokens are one 1-D dataset");
  if (!integer_type(tokens.dtype()))
    throw InputError(where(path, "tokens") + " has type " + tokens.dtype_name() +
                     "; token ids must be uint8, uint16, int32 or int64");
  if (tokens.string_attribute("encoding") == std::optional<std::string>("scaled"))
    throw InputError(where(path, "tokens") + " has encoding 'scaled'; token ids are integers");
}

// The offsets dataset, read whole: from 0, never decreasing, ending at the token count.
std::vector<std::int64_t> read_offsets(const hdf5::Dataset& offsets_set, const std::string& path,
                                       std::int64_t token_count) {
  const auto offset_shape = offsets_set.shape();
  if (offset_shape.size() != 1 || offset_shape[0] < 1 ||
      (offsets_set.dtype() != hdf5::DType::kInt64 && offsets_set.dtype() != hdf5::DType::kInt32))
    throw InputError(where(path, "offsets") + " is " + offsets_set.dtype_name() + " " +
                     shape_text(offset_shape) +
                     "; it must be int64 [documents + 1] (document i is "
                     "tokens[offsets[i]:offsets[i+1]])");
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(offset_shape[0]));
  offsets_set.read_rows(0, offset_shape[0], hdf5::DType::kInt64, offsets.data());
  if (offsets.front() != 0)
    throw InputError(where(path, "offsets") + " starts at " + std::to_string(offsets.front()) +
                     "; it must start at 0");
  for (std::size_t i = 0; i + 1 < offsets.size(); ++i) {
    if (offsets[i + 1] < offsets[i])
      throw InputError(where(path, "offsets") + " decreases at index " + std::to_string(i + 1) +
                       " (" + std::to_string(offsets[i]) + " then " +
                       std::to_string(offsets[i + 1]) + ")");
  }
  if (offsets.back() != token_count)
    throw InputError(where(path, "offsets") + " ends at " + std::to_string(offsets.back()) +
                     " but 'tokens' holds " + std::to_string(token_count) +
                     " tokens; the last offset must be their count");
  return offsets;
}

// The target: the next token, labels on the tokens' offsets, or one label per document.
struct DocumentLabels {
  Documents::Target kind = Documents::Target::kNextToken;
  std::optional<hdf5::Dataset> dataset;  // none for the next token
};
DocumentLabels open_labels(const hdf5::File& file, const std::string& path,
                           const std::string& target, std::int64_t token_count,
                           std::int64_t count) {
  DocumentLabels labels;
  if (target == "next" || (target == "y" && !file.has_dataset("y"))) return labels;
  if (!file.has_dataset(target))
    throw InputError("'" + path + "' has no dataset '" + target +
                     "'; see --targets (document data: next, a per-token labels dataset, or "
                     "one label per document)");
  labels.dataset.emplace(file.dataset(target));
  const auto shape = labels.dataset->shape();
  if (shape.size() != 1 || !integer_type(labels.dataset->dtype()))
    throw InputError(where(path, target) + " is " + labels.dataset->dtype_name() + " " +
                     shape_text(shape) + "; document labels are 1-D integers");
  if (shape[0] == token_count) {
    labels.kind = Documents::Target::kPerToken;
  } else if (shape[0] == count) {
    labels.kind = Documents::Target::kPerDocument;
  } else {
    throw InputError(where(path, target) + " holds " + std::to_string(shape[0]) +
                     " labels; document labels are one per token (" + std::to_string(token_count) +
                     ") or one per document (" + std::to_string(count) + ")");
  }
  return labels;
}

}  // namespace

void SlabReader::open_documents(std::vector<std::string> inputs, std::string target,
                                bool check_labels, std::int64_t ignore_label) {
  schema_.documents = true;
  if (inputs == std::vector<std::string>{"x"}) inputs = {"tokens"};
  if (inputs != std::vector<std::string>{"tokens"} &&
      inputs != std::vector<std::string>{"tokens", "lengths"}) {
    throw UsageError("--inputs " + joined(inputs) + ": '" + paths_.front() +
                     "' holds documents (datasets tokens and offsets); their inputs are tokens, "
                     "or tokens,lengths (docs/data-format.md)");
  }
  layout_.lengths_input = inputs.size() == 2;
  layout_.ignore_index = ignore_label;
  DeclaredClasses declared;
  std::optional<Documents::Target> kind;
  std::string target_type = "int64";
  for (const auto& path : paths_)
    open_document_shard(path, target, declared, kind, target_type);
  layout_.target = *kind;
  layout_.target_name = layout_.target == Documents::Target::kNextToken ? "next token" : target;
  if (schema_.rows == 0)
    throw InputError("'" + paths_.front() + "': document data with no documents");

  const std::int64_t largest = check_document_ids(target, declared, check_labels, ignore_label);
  schema_.num_classes = declared.classes ? *declared.classes : largest + 1;
  schema_.max_label = largest;
  const bool per_document = layout_.target == Documents::Target::kPerDocument;
  schema_.fields.push_back(
      {"tokens", FieldType::kInt64, {-1}, false, shards_.front()->datasets[0].dtype_name()});
  if (layout_.lengths_input)
    schema_.fields.push_back({"lengths", FieldType::kInt64, {}, false, "int64"});
  schema_.fields.push_back(
      {layout_.target_name, FieldType::kInt64,
       per_document ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{-1}, true,
       target_type});
}

void SlabReader::open_document_shard(const std::string& path, const std::string& target,
                                     DeclaredClasses& declared,
                                     std::optional<Documents::Target>& kind,
                                     std::string& target_type) {
  std::unique_ptr<Shard> shard(new Shard{hdf5::File::open(path), {}, 0, {}, -1, {}});
  for (const char* name : {"tokens", "offsets"}) {
    if (!shard->file.has_dataset(name)) {
      throw InputError("'" + path + "' has no dataset '" + name + "': every shard of document " +
                       "data needs tokens and offsets (docs/data-format.md)");
    }
  }
  hdf5::Dataset tokens = shard->file.dataset("tokens");
  check_token_dataset(tokens, path);
  const std::int64_t token_count = tokens.shape()[0];
  shard->offsets = read_offsets(shard->file.dataset("offsets"), path, token_count);
  const std::int64_t count = static_cast<std::int64_t>(shard->offsets.size()) - 1;
  DocumentLabels labels = open_labels(shard->file, path, target, token_count, count);
  if (kind && *kind != labels.kind)
    throw InputError("'" + path + "': --targets " + target + " is not the same kind of label " +
                     "as in '" + paths_.front() + "': shards must agree");
  kind = labels.kind;
  if (labels.dataset) target_type = labels.dataset->dtype_name();
  read_declared_classes(shard->file, path, declared);
  shard->rows = count;
  shard->datasets.push_back(std::move(tokens));
  if (labels.dataset) shard->datasets.push_back(std::move(*labels.dataset));
  const auto& offsets = shard->offsets;
  for (std::size_t i = 0; i + 1 < offsets.size(); ++i) {
    const std::int64_t length = offsets[i + 1] - offsets[i];
    schema_.lengths.push_back(length);
    schema_.tokens += length;
    schema_.max_length = std::max(schema_.max_length, length);
  }
  shard_first_row_.push_back(schema_.rows);
  schema_.rows += count;
  shards_.push_back(std::move(shard));
}

// Ids and labels checked once, up front: one past the classes would index past the logits.
std::int64_t SlabReader::check_document_ids(const std::string& target,
                                            const DeclaredClasses& declared, bool check_labels,
                                            std::int64_t ignore_label) const {
  const bool per_document = layout_.target == Documents::Target::kPerDocument;
  const std::optional<std::int64_t>& declared_classes = declared.classes;
  std::int64_t max_token = -1, max_label = -1;
  for (std::size_t s = 0; s < shards_.size(); ++s) {
    const Shard& shard = *shards_[s];
    const auto document_of = [&](std::int64_t position) {
      return std::upper_bound(shard.offsets.begin(), shard.offsets.end(), position) -
             shard.offsets.begin() - 1;
    };
    scan_integers(shard.datasets[0], shard.offsets.back(), [&](std::int64_t at, std::int64_t id) {
      if (id < 0 || (declared_classes && !per_document && id >= *declared_classes)) {
        throw InputError(
            where(paths_[s], "tokens") + ": token id " + std::to_string(id) + " at position " +
            std::to_string(at) + " (document " + std::to_string(document_of(at)) + ") is " +
            (id < 0 ? "negative" : "at or above num_classes " + std::to_string(*declared_classes)));
      }
      max_token = std::max(max_token, id);
    });
    if (shard.datasets.size() < 2 || !(check_labels || !declared_classes)) continue;
    const std::int64_t count = per_document ? shard.rows : shard.offsets.back();
    scan_integers(shard.datasets[1], count, [&](std::int64_t at, std::int64_t label) {
      if (label == ignore_label) return;
      if (label < 0 || (declared_classes && label >= *declared_classes)) {
        throw InputError(where(paths_[s], target) + ": label " + std::to_string(label) + " at " +
                         (per_document ? "document " : "position ") + std::to_string(at) +
                         " is outside [0, " +
                         (declared_classes ? std::to_string(*declared_classes) + ") (num_classes)"
                                           : std::string("inf)")));
      }
      max_label = std::max(max_label, label);
    });
  }
  return layout_.target == Documents::Target::kNextToken ? max_token : max_label;
}

Batch SlabReader::read_documents(std::int64_t begin, std::int64_t end) const {
  auto documents = std::make_shared<Documents>(layout_);
  const bool per_token = layout_.target == Documents::Target::kPerToken;
  const bool per_document = layout_.target == Documents::Target::kPerDocument;
  struct Piece {
    const Shard* shard;
    std::int64_t first, count;
  };
  std::vector<Piece> pieces;
  std::int64_t total = 0;
  for (std::size_t s = 0; s < shards_.size(); ++s) {
    const std::int64_t shard_begin = shard_first_row_[s];
    const std::int64_t shard_end = shard_begin + shards_[s]->rows;
    const std::int64_t a = std::max(begin, shard_begin), b = std::min(end, shard_end);
    if (a >= b) continue;
    pieces.push_back({shards_[s].get(), a - shard_begin, b - a});
    const auto& offsets = shards_[s]->offsets;
    total += offsets[static_cast<std::size_t>(b - shard_begin)] -
             offsets[static_cast<std::size_t>(a - shard_begin)];
  }
  const auto options = at::TensorOptions().dtype(at::kLong).pinned_memory(pinned_);
  documents->tokens = at::empty({total}, options);
  if (per_token) documents->labels = at::empty({total}, options);
  if (per_document) documents->labels = at::empty({end - begin}, options);
  documents->offsets.assign(1, 0);
  std::int64_t done_tokens = 0, done_documents = 0;
  for (const Piece& piece : pieces) {
    const auto& offsets = piece.shard->offsets;
    const std::int64_t t0 = offsets[static_cast<std::size_t>(piece.first)];
    const std::int64_t t1 = offsets[static_cast<std::size_t>(piece.first + piece.count)];
    piece.shard->datasets[0].read_rows(t0, t1 - t0, hdf5::DType::kInt64,
                                       documents->tokens.data_ptr<std::int64_t>() + done_tokens);
    if (per_token) {
      piece.shard->datasets[1].read_rows(t0, t1 - t0, hdf5::DType::kInt64,
                                         documents->labels.data_ptr<std::int64_t>() + done_tokens);
    } else if (per_document) {
      piece.shard->datasets[1].read_rows(
          piece.first, piece.count, hdf5::DType::kInt64,
          documents->labels.data_ptr<std::int64_t>() + done_documents);
    }
    for (std::int64_t i = 1; i <= piece.count; ++i)
      documents->offsets.push_back(done_tokens +
                                   offsets[static_cast<std::size_t>(piece.first + i)] - t0);
    done_tokens += t1 - t0;
    done_documents += piece.count;
  }
  Batch batch;
  batch.first_row = begin;
  batch.set_documents(std::move(documents));
  return batch;
}

std::string DataSchema::describe_documents() const {
  std::vector<std::int64_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  const auto at = [&](double q) {
    if (sorted.empty()) return std::int64_t{0};
    return sorted[static_cast<std::size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5)];
  };
  std::ostringstream out;
  out << rows << " documents, " << tokens << " tokens; length min " << at(0) << ", p50 " << at(0.5)
      << ", p90 " << at(0.9) << ", p99 " << at(0.99) << ", max " << at(1);
  return out.str();
}

}  // namespace autoaccum::data
