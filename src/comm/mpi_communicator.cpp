// MpiCommunicator: MPI collectives with every return code checked.
#include "autoaccum/comm/mpi_communicator.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

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

// The watchdog's announcement: "this rank timed out (or answers) at watched collective N".
constexpr int kTimeoutTag = 7001;
constexpr std::size_t kHostBytes = 64;

using Clock = std::chrono::steady_clock;

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
    check_mpi(MPI_Comm_dup(comm_, &watch_comm_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_set_errhandler(watch_comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");

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
    const char* skip = std::getenv("AUTOACCUM_WATCHDOG_SKIP_ARRIVAL");
    skip_arrival_ = skip && std::string(skip) == "1";
  } catch (...) {
    if (watch_comm_ != MPI_COMM_NULL) MPI_Comm_free(&watch_comm_);
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
  if (watch_comm_ != MPI_COMM_NULL) MPI_Comm_free(&watch_comm_);
  if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::arrive(const char* what) {
  const Watchdog& dog = watchdog();
  if (!dog.enabled() || size_ == 1 || skip_arrival_) return;
  ++arrivals_;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
  const auto start = Clock::now();
  const auto deadline = start + dog.timeout();
  for (unsigned polls = 1;; ++polls) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test(arrival)");
    if (done) return;
    if (polls % 256 == 0) {
      // Another rank's announcement means it has timed out at this collective: answer it now.
      int announced = 0;
      check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kTimeoutTag, watch_comm_, &announced, MPI_STATUS_IGNORE),
                "MPI_Iprobe(watchdog)");
      const auto now = Clock::now();
      if (announced || now >= deadline) diagnose(what, now - start);
      std::this_thread::yield();  // a rank waiting on an oversubscribed node gives the CPU away
    }
  }
}

void MpiCommunicator::diagnose(const char* what, Clock::duration waited) {
  // Every rank that is waiting tells every other rank which collective it waits at, and listens
  // for the same for a grace period; whoever does not answer did not arrive. A rank that arrives
  // late, after an announcement, answers too, marked late: it counts as not having arrived.
  // Return codes are ignored: a peer that is gone must not hide the timeout behind a send error.
  const Watchdog& dog = watchdog();
  const bool late = waited < dog.timeout() / 2;
  announced_[0] = arrivals_;
  announced_[1] = late ? 1 : 0;
  const auto n = static_cast<std::size_t>(size_);
  std::vector<std::int64_t> answers(2 * n, -1);
  std::vector<MPI_Request> receives(n, MPI_REQUEST_NULL);
  int pending = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const auto at = static_cast<std::size_t>(r);
    MPI_Request send = MPI_REQUEST_NULL;
    if (MPI_Isend(announced_, 2, MPI_INT64_T, r, kTimeoutTag, watch_comm_, &send) == MPI_SUCCESS)
      MPI_Request_free(&send);
    if (MPI_Irecv(&answers[2 * at], 2, MPI_INT64_T, r, kTimeoutTag, watch_comm_, &receives[at]) ==
        MPI_SUCCESS)
      ++pending;
  }
  const auto until = Clock::now() + grace_period(dog.timeout());
  while (pending > 0 && Clock::now() < until) {
    for (auto& receive : receives) {
      if (receive == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&receive, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) {
        receive = MPI_REQUEST_NULL;
        --pending;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  TimeoutReport report;
  report.collective = what;
  report.timeout = dog.timeout();
  report.hosts = hosts_;
  report.context = dog.context();
  for (int r = 0; r < size_; ++r) {
    const auto at = static_cast<std::size_t>(r);
    const std::int64_t answer = r == rank_ ? announced_[0] : answers[2 * at];
    const bool answered_late = r == rank_ ? late : answers[2 * at + 1] == 1;
    if (answer < 0 || answered_late)
      report.absent.push_back(r);
    else if (answer == announced_[0])
      report.present.push_back(r);
    else
      report.elsewhere.push_back(r);
  }
  // The lowest rank that waited says the line: rank 0 whenever rank 0 can still talk.
  const bool reporter = !late && !report.present.empty() && report.present.front() == rank_;
  throw CollectiveTimeout(describe_timeout(report), reporter);
}

void MpiCommunicator::allreduce(void* data, std::size_t count, MPI_Datatype type,
                                std::size_t type_bytes, MPI_Op op, const char* what) {
  arrive(what);
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
  arrive("MPI_Allgather");
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
  arrive("MPI_Bcast");
  const Watchdog::Guard guard(watchdog(), "MPI_Bcast");
  auto* p = static_cast<char*>(data);
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t chunk = std::min(bytes - done, kMaxChunk);
    check_mpi(MPI_Bcast(p + done, static_cast<int>(chunk), MPI_BYTE, root, comm_), "MPI_Bcast");
    done += chunk;
  }
}

void MpiCommunicator::barrier() {
  arrive("MPI_Barrier");
  const Watchdog::Guard guard(watchdog(), "MPI_Barrier");
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

}  // namespace autoaccum::comm
