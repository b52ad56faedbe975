// OptimizerCheckpoint: the optimizer's state written per parameter, from whichever rank holds it.
#include "optimizer_checkpoint.hpp"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>

#include "autoaccum/core/error.hpp"

namespace autoaccum::train {
namespace {

constexpr std::int64_t kPieceFloats = std::int64_t{16} << 20;  // 64 MiB

// `t` (float32, anywhere) to `sink` in host pieces.
void stream_tensor(const at::Tensor& t, const io::Checkpoint::PieceSink& sink) {
  const at::Tensor flat = t.detach().reshape(-1);
  const std::int64_t n = flat.numel();
  if (flat.is_cpu() && flat.is_contiguous() && flat.scalar_type() == at::kFloat) {
    sink(flat.data_ptr<float>(), n);
    return;
  }
  for (std::int64_t done = 0; done < n; done += kPieceFloats) {
    const at::Tensor piece = flat.narrow(0, done, std::min(kPieceFloats, n - done))
                                 .to(at::kCPU)
                                 .to(at::kFloat)
                                 .contiguous();
    sink(piece.data_ptr<float>(), piece.numel());
  }
}

}  // namespace

std::vector<std::string> trainable_names(
    const std::vector<std::pair<std::string, at::Tensor>>& named,
    const std::vector<at::Tensor>& trainable) {
  std::vector<std::string> names;
  for (const auto& p : trainable) {
    const auto it = std::find_if(named.begin(), named.end(), [&](const auto& n) {
      return n.second.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
    });
    if (it == named.end()) throw Error("internal: a trainable parameter has no name");
    names.push_back(it->first);
  }
  return names;
}

OptimizerCheckpoint::OptimizerCheckpoint(comm::Communicator& comm, OptimizerStep& optimizer,
                                         const Reducer& reducer,
                                         const std::vector<at::Tensor>& trainable,
                                         const std::vector<std::string>& names)
    : comm_(comm),
      optimizer_(optimizer),
      shards_(reducer.shards()),
      trainable_(trainable),
      names_(names),
      kinds_(optimizer.state_kinds()) {
  if (!shards_) return;
  for (std::size_t k = 0; k < kinds_.size(); ++k) {
    for (std::size_t i = 0; i < trainable_.size(); ++i) {
      const std::int64_t first = shards_->offsets[i], last = first + trainable_[i].numel();
      for (int owner = 0; owner < shards_->world; ++owner) {
        const std::int64_t begin = std::max(first, shards_->begin(owner));
        const std::int64_t end = std::min(last, shards_->end(owner));
        for (std::int64_t at = begin; at < end; at += kPieceFloats)
          pieces_.push_back({k, i, owner, at, std::min(kPieceFloats, end - at)});
      }
    }
  }
}

void OptimizerCheckpoint::take(const Piece& piece, std::vector<float>& host) {
  host.resize(static_cast<std::size_t>(piece.count));
  if (comm_.rank() == piece.owner) {
    const at::Tensor mine = optimizer_.state(0, kinds_[piece.kind]);
    const at::Tensor part =
        mine.narrow(0, piece.offset - shards_->begin(piece.owner), piece.count).to(at::kCPU);
    at::from_blob(host.data(), {piece.count}, at::kFloat).copy_(part);
  }
  comm_.broadcast(host.data(), host.size() * sizeof(float), piece.owner);
}

std::vector<io::Checkpoint::StreamedTensor> OptimizerCheckpoint::tensors() {
  std::vector<io::Checkpoint::StreamedTensor> out;
  for (std::size_t k = 0; k < kinds_.size(); ++k) {
    for (std::size_t i = 0; i < trainable_.size(); ++i) {
      io::Checkpoint::StreamedTensor t;
      t.name = kinds_[k] + "/" + names_[i];
      t.shape.assign(trainable_[i].sizes().begin(), trainable_[i].sizes().end());
      if (!shards_) {
        t.fill = [this, k, i](const io::Checkpoint::PieceSink& sink) {
          stream_tensor(optimizer_.state(i, kinds_[k]), sink);
        };
      } else {
        t.fill = [this, k, i](const io::Checkpoint::PieceSink& sink) {
          std::vector<float> host;
          while (next_ < pieces_.size() && pieces_[next_].kind == k &&
                 pieces_[next_].parameter == i) {
            take(pieces_[next_++], host);
            sink(host.data(), static_cast<std::int64_t>(host.size()));
          }
        };
      }
      out.push_back(std::move(t));
    }
  }
  return out;
}

void OptimizerCheckpoint::finish_exchange() {
  std::vector<float> host;
  while (next_ < pieces_.size())
    take(pieces_[next_++], host);
  next_ = 0;  // the next checkpoint starts again from the first piece
}

std::string OptimizerCheckpoint::load(const io::Checkpoint& c) {
  if (c.optimizer_kind != optimizer_.kind()) {
    return "its optimizer state is " + c.optimizer_kind + "'s, and this run's --optimizer is " +
           optimizer_.kind();
  }
  const at::NoGradGuard no_grad;
  for (const auto& kind : kinds_) {
    for (std::size_t i = 0; i < trainable_.size(); ++i) {
      const std::string name = kind + "/" + names_[i];
      const auto it = std::find_if(c.optimizer_state.begin(), c.optimizer_state.end(),
                                   [&](const auto& s) { return s.name == name; });
      if (it == c.optimizer_state.end())
        return "optimizer state does not match the model: 'optimizer/" + name + "' is missing";
      if (it->numel() != trainable_[i].numel())
        return "optimizer state does not match the model: 'optimizer/" + name + "' has " +
               std::to_string(it->numel()) + " elements, the parameter " +
               std::to_string(trainable_[i].numel());
      if (!shards_) {
        io::read_stored(*it, 0, optimizer_.state(i, kind).view(-1));
        continue;
      }
      // This rank's part of the parameter, if any: only it is read.
      const int rank = comm_.rank();
      const std::int64_t first = shards_->offsets[i], last = first + trainable_[i].numel();
      const std::int64_t begin = std::max(first, shards_->begin(rank));
      const std::int64_t end = std::min(last, shards_->end(rank));
      if (begin >= end) continue;
      io::read_stored(
          *it, begin - first,
          optimizer_.state(0, kind).narrow(0, begin - shards_->begin(rank), end - begin));
    }
  }
  optimizer_.set_step_count(c.optimizer_step);
  return "";
}

}  // namespace autoaccum::train
