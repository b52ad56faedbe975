// The collective watchdog: a deadline on every collective, so that a rank that never arrives (a
// dead node, a cut link, a stalled file system) ends the job with one line instead of a hang.
//
// A watched collective has two parts (MpiCommunicator::arrive and the blocking call after it):
//  - arrival: a non-blocking barrier polled against the deadline. Past it, the waiting ranks
//    tell each other where they are (point to point, a short grace period) and each throws
//    CollectiveTimeout naming the ranks that did not answer; the lowest answering rank says it.
//  - the collective itself, blocking (MPI's fastest algorithms; a non-blocking all-reduce is up
//    to 2x slower here), under this watchdog's thread: every rank arrived, so only a link or a
//    rank failing inside the collective can stall it; past the deadline the thread prints one
//    line, runs the last words (the run log) and ends the job through MPI_Abort with exit code 5.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace autoaccum::comm {

using Milliseconds = std::chrono::milliseconds;

// What the waiting ranks learned when a collective timed out.
struct TimeoutReport {
  std::string collective;          // e.g. "MPI_Allreduce(float, sum)"
  Milliseconds timeout{0};         // the deadline it passed
  std::vector<int> absent;         // ranks that did not answer
  std::vector<int> present;        // ranks that answered (waiting at the same collective)
  std::vector<int> elsewhere;      // ranks that answered from a different collective (a bug)
  std::vector<std::string> hosts;  // every rank's host, by rank
  std::string context;             // the caller's "at step 12; last checkpoint ..."
};

// The one line: "collective timeout: rank 2 on node2 did not reach MPI_Allreduce(float, sum)
// within 10 s (--collective-timeout; ranks 0-1, 3 waited) in step 12 of 100; last checkpoint...".
std::string describe_timeout(const TimeoutReport& report);

// "0-3, 5, 7-8": sorted ranks as ranges.
std::string rank_ranges(std::vector<int> ranks);

// "10 s", "0.5 s", "10 min".
std::string duration_text(Milliseconds duration);

// How long the ranks that timed out listen for each other: a tenth of the timeout, 1 to 10 s.
Milliseconds grace_period(Milliseconds timeout);

class Watchdog {
 public:
  Watchdog() = default;
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Sets the deadline of every collective (0 turns the watchdog off) and starts or stops the
  // thread. `rank` names this process in the thread's line.
  void configure(Milliseconds timeout, int rank);
  Milliseconds timeout() const noexcept { return Milliseconds(timeout_ms_.load()); }
  bool enabled() const noexcept { return timeout_ms_.load() > 0; }

  // Appended to every timeout message: where the run is ("at step 12; last checkpoint ...").
  void set_context(std::string context);
  std::string context() const;
  // Run by the thread before it ends the process (rank 0 writes the run log's status). The main
  // thread is blocked inside MPI at that moment.
  void set_last_words(std::function<void(const std::string& message)> last_words);

  // The blocking part of a collective: armed while it runs.
  class Guard {
   public:
    Guard(Watchdog& dog, const char* what) noexcept;
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    Watchdog& dog_;
  };

 private:
  void watch();
  [[noreturn]] void fire(const char* what);
  void stop_thread();

  std::atomic<std::int64_t> timeout_ms_{0};
  std::atomic<std::int64_t> armed_at_ns_{0};  // steady clock; 0 while no collective runs
  std::atomic<const char*> armed_what_{nullptr};
  int rank_ = 0;
  mutable std::mutex context_mutex_;
  std::string context_;
  std::function<void(const std::string&)> last_words_;
  std::mutex thread_mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// The process's watchdog: one thread per process, shared by every communicator.
Watchdog& watchdog();

}  // namespace autoaccum::comm
