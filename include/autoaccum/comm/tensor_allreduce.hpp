// All-reduce of LibTorch tensors through a Communicator (keeps torch out of communicator.hpp).
#pragma once

#include "autoaccum/comm/communicator.hpp"

namespace at {
class Tensor;
}

namespace autoaccum::comm {

// In-place sum over ranks of a contiguous float32 or float64 tensor whose device matches the
// communicator's buffer memory (CPU for MPI, CUDA for NCCL). Anything else is a CommError.
void allreduce_sum(Communicator& comm, const at::Tensor& tensor);

}  // namespace autoaccum::comm
