// make_communicator: the backend choice for --backend.
#include "autoaccum/comm/factory.hpp"

#include <string>

#include "autoaccum/comm/mpi_communicator.hpp"
#include "autoaccum/comm/nccl_communicator.hpp"
#include "autoaccum/core/error.hpp"

namespace autoaccum::comm {

Backend parse_backend(std::string_view text) {
  if (text == "auto") return Backend::kAuto;
  if (text == "mpi") return Backend::kMpi;
  if (text == "nccl") return Backend::kNccl;
  throw UsageError("--backend: '" + std::string(text) + "' is not one of auto, mpi, nccl");
}

std::string_view to_string(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kMpi:
      return "mpi";
    case Backend::kNccl:
      return "nccl";
  }
  return "unknown";
}

std::unique_ptr<Communicator> make_communicator(Backend backend, MemoryKind buffers) {
  if (backend == Backend::kAuto) {
    if (buffers == MemoryKind::kDevice && !nccl_built()) {
      throw UsageError(
          "--device cuda needs the NCCL communicator, and this build has none (configure with the "
          "CUDA toolkit and NCCL found: NCCL_HOME or -DNCCL_LIBRARY; see docs/gpu.md)");
    }
    backend = buffers == MemoryKind::kDevice ? Backend::kNccl : Backend::kMpi;
  }
  if (backend == Backend::kNccl) {
    if (buffers == MemoryKind::kHost) {
      throw UsageError("--backend nccl needs --device cuda: NCCL reduces GPU memory only");
    }
    return std::make_unique<NcclCommunicator>(std::make_unique<MpiCommunicator>());
  }
  if (buffers == MemoryKind::kDevice) {
    throw UsageError(
        "--backend mpi with --device cuda: this build's MPI path reduces host memory only; use "
        "--backend nccl or auto");
  }
  return std::make_unique<MpiCommunicator>();
}

}  // namespace autoaccum::comm
