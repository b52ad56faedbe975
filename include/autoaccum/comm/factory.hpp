// Chooses and builds the communicator backend from --backend.
#pragma once

#include <memory>
#include <string_view>

#include "autoaccum/comm/communicator.hpp"

namespace autoaccum::comm {

enum class Backend { kAuto, kMpi, kNccl };

// "auto", "mpi" or "nccl"; anything else is a UsageError naming --backend.
Backend parse_backend(std::string_view text);
std::string_view to_string(Backend backend);

// Collective over MPI_COMM_WORLD. `buffers` says where the caller's gradient buffers live:
// auto picks NCCL for device buffers when NCCL is built, and MPI for host buffers.
// Asking for NCCL with host buffers, or for MPI with device buffers, is a UsageError.
std::unique_ptr<Communicator> make_communicator(Backend backend, MemoryKind buffers);

}  // namespace autoaccum::comm
