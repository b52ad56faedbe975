// allreduce_sum for tensors: checks layout, dtype and device, then hands the storage over.
#include "autoaccum/comm/tensor_allreduce.hpp"

#include <ATen/core/Tensor.h>

#include <sstream>

#include "autoaccum/core/error.hpp"

namespace autoaccum::comm {

void allreduce_sum(Communicator& comm, const at::Tensor& tensor) {
  if (!tensor.defined()) {
    throw CommError("rank " + std::to_string(comm.rank()) +
                    ": cannot all-reduce an undefined tensor");
  }
  auto fail = [&](const std::string& why) {
    std::ostringstream text;
    text << "rank " << comm.rank() << ": cannot all-reduce a " << tensor.scalar_type()
         << " tensor on " << tensor.device() << ": " << why;
    throw CommError(text.str());
  };
  if (!tensor.is_contiguous()) fail("it is not contiguous");
  const bool on_gpu = tensor.is_cuda();
  if (on_gpu != (comm.buffer_memory() == MemoryKind::kDevice)) {
    fail(std::string("the ") + std::string(comm.backend()) + " communicator reduces " +
         (on_gpu ? "host" : "device") + " memory");
  }
  const auto count = static_cast<std::size_t>(tensor.numel());
  switch (tensor.scalar_type()) {
    case at::kFloat:
      comm.allreduce_sum(tensor.data_ptr<float>(), count);
      break;
    case at::kDouble:
      comm.allreduce_sum(tensor.data_ptr<double>(), count);
      break;
    default:
      fail("only float32 and float64 are supported");
  }
}

}  // namespace autoaccum::comm
