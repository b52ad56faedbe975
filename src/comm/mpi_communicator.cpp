// MpiCommunicator: MPI collectives with every return code checked.
#include "autoaccum/comm/mpi_communicator.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <deque>
#include <optional>
#include <string>

#include "autoaccum/comm/watchdog.hpp"
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

constexpr std::size_t kHostBytes = 64;

// The watchdog threads' messages over a private duplicate: "I timed out" and "here I am". Only
// the watchdog's thread calls it, and only under MPI_THREAD_MULTIPLE. Owned by the (not movable)
// MpiCommunicator whose host names it shares.
class MpiWatchChannel final : public WatchChannel {
 public:
  MpiWatchChannel(MPI_Comm parent, int rank, int size, const std::vector<std::string>& hosts)
      : rank_(rank), size_(size), hosts_(hosts) {
    check_mpi(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiWatchChannel() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<std::string>& hosts() const override { return hosts_; }

  void announce(const WatchState& mine) override {
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) send(r, kAnnounce, mine);
    }
  }
  void answer(int to, const WatchState& mine) override { send(to, kAnswer, mine); }
  std::optional<WatchState> next_announcement(int& from) override { return next(kAnnounce, from); }
  std::optional<WatchState> next_answer(int& from) override { return next(kAnswer, from); }

 private:
  static constexpr int kAnnounce = 7001, kAnswer = 7002;

  // Non-blocking: a peer that is gone must not hold this thread. The message stays in `sent_`
  // (a few per rank, only ever during a timeout) until the process ends.
  void send(int to, int tag, const WatchState& state) {
    sent_.push_back({state.collective, state.waited_ms});
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(sent_.back().data(), 2, MPI_INT64_T, to, tag, comm_, &request) == MPI_SUCCESS)
      MPI_Request_free(&request);
  }

  std::optional<WatchState> next(int tag, int& from) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, tag, comm_, &arrived, &status) != MPI_SUCCESS || !arrived)
      return std::nullopt;
    std::int64_t message[2] = {-1, 0};
    if (MPI_Recv(message, 2, MPI_INT64_T, status.MPI_SOURCE, tag, comm_, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS)
      return std::nullopt;
    from = status.MPI_SOURCE;
    return WatchState{message[0], message[1]};
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_, size_;
  const std::vector<std::string>& hosts_;  // the owning communicator's
  std::deque<std::array<std::int64_t, 2>> sent_;
};

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

    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    check_mpi(MPI_Get_processor_name(name, &length), "MPI_Get_processor_name");
    char mine[kHostBytes] = {};
    std::memcpy(mine, name,
                std::min<std::size_t>(static_cast<std::size_t>(length), kHostBytes - 1));
    std::vector<char> all(kHostBytes * static_cast<std::size_t>(size_));
    check_mpi(MPI_Allgather(mine, kHostBytes, MPI_CHAR, all.data(), kHostBytes, MPI_CHAR, comm_),
              "MPI_Allgather(host names)");
    for (int r = 0; r < size_; ++r)
      hosts_.emplace_back(all.data() + static_cast<std::size_t>(r) * kHostBytes);
    int level = MPI_THREAD_SINGLE;
    check_mpi(MPI_Query_thread(&level), "MPI_Query_thread");
    any_thread_ = level >= MPI_THREAD_SERIALIZED;
    if (level == MPI_THREAD_MULTIPLE) {
      channel_ = std::make_unique<MpiWatchChannel>(comm_, rank_, size_, hosts_);
      watchdog().attach(channel_.get());
    }
  } catch (...) {
    if (channel_) watchdog().detach(channel_.get());
    channel_.reset();
    if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
    MPI_Comm_free(&comm_);
    throw;
  }
}

MpiCommunicator::~MpiCommunicator() {
  // MPI_Comm_free after MPI_Finalize is erroneous; a destructor must not throw either way.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (channel_) watchdog().detach(channel_.get());
  if (finalized) return;
  channel_.reset();
  if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::allreduce(void* data, std::size_t count, MPI_Datatype type,
                                std::size_t type_bytes, MPI_Op op, const char* what) {
  const Watchdog::Guard guard(watchdog(), what);
  auto* bytes = static_cast<char*>(data);
  for (std::size_t done = 0; done < count;) {
    const std::size_t chunk = std::min(count - done, kMaxChunk);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, bytes + done * type_bytes, static_cast<int>(chunk), type,
                            op, comm_),
              what);
    done += chunk;
  }
}

void MpiCommunicator::do_allreduce_sum(float* data, std::size_t count, const char* what) {
  allreduce(data, count, MPI_FLOAT, sizeof(float), MPI_SUM,
            what ? what : "MPI_Allreduce(float, sum)");
}

void MpiCommunicator::do_allreduce_sum(double* data, std::size_t count, const char* what) {
  allreduce(data, count, MPI_DOUBLE, sizeof(double), MPI_SUM,
            what ? what : "MPI_Allreduce(double, sum)");
}

void MpiCommunicator::do_reduce_scatter_sum(float* data, std::size_t chunk, const char* what) {
  if (chunk > kMaxChunk)
    throw CommError("reduce-scatter: " + std::to_string(chunk) + " floats per rank is too many");
  const Watchdog::Guard guard(watchdog(), what ? what : "MPI_Reduce_scatter_block(float, sum)");
  check_mpi(MPI_Reduce_scatter_block(MPI_IN_PLACE, data, static_cast<int>(chunk), MPI_FLOAT,
                                     MPI_SUM, comm_),
            what ? what : "MPI_Reduce_scatter_block");
  // In place, MPI leaves this rank's sum at the start of the buffer; its place is its chunk.
  if (rank_ > 0 && chunk > 0)
    std::memcpy(data + static_cast<std::size_t>(rank_) * chunk, data, chunk * sizeof(float));
}

void MpiCommunicator::do_reduce_sum(float* data, std::size_t count, int root, const char* what) {
  const Watchdog::Guard guard(watchdog(), what ? what : "MPI_Reduce(float, sum)");
  for (std::size_t done = 0; done < count;) {
    const std::size_t chunk = std::min(count - done, kMaxChunk);
    float* at = data + done;
    check_mpi(MPI_Reduce(rank_ == root ? MPI_IN_PLACE : at, at, static_cast<int>(chunk), MPI_FLOAT,
                         MPI_SUM, root, comm_),
              what ? what : "MPI_Reduce");
    done += chunk;
  }
}

void MpiCommunicator::do_allgather_in_place(float* data, std::size_t chunk, const char* what) {
  if (chunk > kMaxChunk)
    throw CommError("all-gather: " + std::to_string(chunk) + " floats per rank is too many");
  const Watchdog::Guard guard(watchdog(), what ? what : "MPI_Allgather(float)");
  check_mpi(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, static_cast<int>(chunk),
                          MPI_FLOAT, comm_),
            what ? what : "MPI_Allgather");
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
  const Watchdog::Guard guard(watchdog(), "MPI_Allgather");
  check_mpi(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, receive, static_cast<int>(bytes),
                          MPI_BYTE, comm_),
            "MPI_Allgather");
}

void MpiCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size_) {
    throw CommError("broadcast: root " + std::to_string(root) + " is not a rank of a world of " +
                    std::to_string(size_));
  }
  const Watchdog::Guard guard(watchdog(), "MPI_Bcast");
  auto* p = static_cast<char*>(data);
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t chunk = std::min(bytes - done, kMaxChunk);
    check_mpi(MPI_Bcast(p + done, static_cast<int>(chunk), MPI_BYTE, root, comm_), "MPI_Bcast");
    done += chunk;
  }
}

void MpiCommunicator::barrier() {
  const Watchdog::Guard guard(watchdog(), "MPI_Barrier");
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

}  // namespace autoaccum::comm
