// MpiCommunicator: MPI collectives with every return code checked.
#include "autoaccum/comm/mpi_communicator.hpp"

#include <algorithm>
#include <climits>
#include <string>

#include "autoaccum/core/error.hpp"

namespace autoaccum::comm {
namespace {

int world_rank() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int rank = -1;
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// MPI counts are int: large buffers go in pieces of at most INT_MAX elements.
constexpr std::size_t kMaxChunk = static_cast<std::size_t>(INT_MAX);

}  // namespace

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  throw CommError("rank " + std::to_string(world_rank()) + ": " + call +
                  " failed: " + std::string(text, static_cast<std::size_t>(length)));
}

MpiCommunicator::MpiCommunicator(MPI_Comm parent) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw CommError("MpiCommunicator: MPI_Init has not been called");
  check_mpi(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
  try {
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_comm_),
              "MPI_Comm_split_type");
    check_mpi(MPI_Comm_set_errhandler(local_comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(local_comm_, &local_rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(local_comm_, &local_size_), "MPI_Comm_size");
  } catch (...) {
    if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
    MPI_Comm_free(&comm_);
    throw;
  }
}

MpiCommunicator::~MpiCommunicator() {
  // MPI_Comm_free after MPI_Finalize is erroneous; a destructor must not throw either way.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::allreduce(void* data, std::size_t count, MPI_Datatype type,
                                std::size_t type_bytes, MPI_Op op, const char* what) {
  auto* bytes = static_cast<char*>(data);
  for (std::size_t done = 0; done < count;) {
    const std::size_t chunk = std::min(count - done, kMaxChunk);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, bytes + done * type_bytes, static_cast<int>(chunk), type,
                            op, comm_),
              what);
    done += chunk;
  }
}

void MpiCommunicator::do_allreduce_sum(float* data, std::size_t count) {
  allreduce(data, count, MPI_FLOAT, sizeof(float), MPI_SUM, "MPI_Allreduce(float, sum)");
}

void MpiCommunicator::do_allreduce_sum(double* data, std::size_t count) {
  allreduce(data, count, MPI_DOUBLE, sizeof(double), MPI_SUM, "MPI_Allreduce(double, sum)");
}

void MpiCommunicator::allreduce_max(std::int64_t* values, std::size_t count) {
  allreduce(values, count, MPI_INT64_T, sizeof(std::int64_t), MPI_MAX, "MPI_Allreduce(int64, max)");
}

void MpiCommunicator::allreduce_sum(std::int64_t* values, std::size_t count) {
  allreduce(values, count, MPI_INT64_T, sizeof(std::int64_t), MPI_SUM, "MPI_Allreduce(int64, sum)");
}

void MpiCommunicator::allreduce_min(std::int64_t* values, std::size_t count) {
  allreduce(values, count, MPI_INT64_T, sizeof(std::int64_t), MPI_MIN, "MPI_Allreduce(int64, min)");
}

void MpiCommunicator::allreduce_sum_host(double* values, std::size_t count) {
  allreduce(values, count, MPI_DOUBLE, sizeof(double), MPI_SUM, "MPI_Allreduce(double, sum)");
}

void MpiCommunicator::allgather(const void* send, std::size_t bytes, void* receive) {
  if (bytes > kMaxChunk)
    throw CommError("allgather: " + std::to_string(bytes) + " bytes per rank is too many");
  check_mpi(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, receive, static_cast<int>(bytes),
                          MPI_BYTE, comm_),
            "MPI_Allgather");
}

void MpiCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size_) {
    throw CommError("broadcast: root " + std::to_string(root) + " is not a rank of a world of " +
                    std::to_string(size_));
  }
  auto* p = static_cast<char*>(data);
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t chunk = std::min(bytes - done, kMaxChunk);
    check_mpi(MPI_Bcast(p + done, static_cast<int>(chunk), MPI_BYTE, root, comm_), "MPI_Bcast");
    done += chunk;
  }
}

void MpiCommunicator::barrier() {
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

}  // namespace autoaccum::comm
