// The collective watchdog: a deadline on every collective, so that a rank that never arrives (a
// dead node, a cut link, a stalled file system) ends the job with one line instead of a hang.
//
// Every collective stays MPI's blocking call (its fastest algorithms; a non-blocking all-reduce
// is up to 2x slower here). A Guard arms the process's watchdog thread around it: two atomic
// stores, nothing on the wire. Past the deadline the thread finds out which ranks are missing
// by asking the other ranks' watchdog threads over a WatchChannel (point to point, beside the
// collectives; MpiCommunicator provides one when MPI gives MPI_THREAD_MULTIPLE): every thread
// answers at once whether its rank waits in the same collective, runs outside any collective, or
// waits at another; a rank whose thread does not answer within a grace period is dead or cut off.
// The lowest rank that waited says one line, every rank that timed out runs its last words
// (rank 0 writes the run log), and MPI_Abort ends the job with exit code 5.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace autoaccum::comm {

using Milliseconds = std::chrono::milliseconds;

// What the waiting ranks learned when a collective timed out.
struct TimeoutReport {
  std::string collective;          // e.g. "MPI_Allreduce(float, sum)"
  Milliseconds timeout{0};         // the deadline it passed
  std::vector<int> present;        // ranks waiting in this collective, the one before or after
                                   // (a link that fails mid-collective lets some ranks finish it)
  std::vector<int> running;        // ranks that answered from outside any collective
  std::vector<int> silent;         // ranks that did not answer: process, node or link down
  std::vector<int> elsewhere;      // ranks waiting in a collective further off (a bug)
  std::vector<std::string> hosts;  // every rank's host, by rank
  std::string context;             // the caller's "in step 12 of 100; last checkpoint ..."
  bool located = true;  // false: no channel to ask (no MPI_THREAD_MULTIPLE); `rank` timed out
  int rank = 0;
};

// What a rank's watchdog thread tells another: the watched collective its rank waits in (the
// count of collectives it has entered; -1 while it runs outside any) and for how long.
struct WatchState {
  std::int64_t collective = -1;
  std::int64_t waited_ms = 0;
};

// The watchdog threads' messages to each other, beside the collectives. Called from the
// watchdog's thread only.
class WatchChannel {
 public:
  virtual ~WatchChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::vector<std::string>& hosts() const = 0;
  // "This rank timed out": to every other rank, whose thread answers with its state.
  virtual void announce(const WatchState& mine) = 0;
  virtual void answer(int to, const WatchState& mine) = 0;
  // The next announcement or answer that has arrived, if any; `from` is its sender.
  virtual std::optional<WatchState> next_announcement(int& from) = 0;
  virtual std::optional<WatchState> next_answer(int& from) = 0;
};

// Sorts the answers (by rank; nullopt: none came) of a timeout at `mine.collective` on `self`.
TimeoutReport tally(int self, const WatchState& mine,
                    const std::vector<std::optional<WatchState>>& answers);

// The one line: "collective timeout: MPI_Allreduce(float, sum) did not complete within 10 s
// (--collective-timeout): rank 2 on node2 did not reach it (still running); ranks 0, 1, 3
// waited; in step 12 of 100; last checkpoint: run.ckpt.h5 at step 10".
std::string describe_timeout(const TimeoutReport& report);

// "0-3, 5, 7-8": sorted ranks as ranges.
std::string rank_ranges(std::vector<int> ranks);

// "10 s", "0.5 s", "10 min".
std::string duration_text(Milliseconds duration);

// How long the last words (rank 0's run log) may take before the job is ended without them.
inline constexpr std::chrono::seconds kLastWordsDeadline{5};

// How long a rank that timed out but does not report waits for the reporter's MPI_Abort to end
// it before it calls MPI_Abort itself.
inline constexpr std::chrono::seconds kNonReporterAbortDelay{15};

// How long a rank that timed out listens for the others' answers: a tenth of the timeout, 1 to
// 10 s.
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
  // Run by the thread before it ends the process (rank 0 writes the run log's status), on a
  // thread of their own and for at most kLastWordsDeadline. The main thread is blocked inside
  // MPI at that moment; if its collective completes meanwhile, it stops at its next collective
  // or at its next set_last_words (which it calls before the state they use goes away).
  void set_last_words(std::function<void(const std::string& message)> last_words);

  // The channel the thread answers on and asks through (the first attached is kept; a channel
  // detaches before it goes away). Without one a timeout cannot name the missing ranks.
  void attach(WatchChannel* channel);
  void detach(WatchChannel* channel);

  // A collective: the watchdog is armed while it runs.
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
  WatchState state() const;
  void answer_announcements(WatchChannel& channel) const;
  void stop_thread();
  void park_if_firing() const noexcept;

  std::atomic<std::int64_t> timeout_ms_{0};
  std::atomic<std::int64_t> armed_at_ns_{0};  // steady clock; 0 while no collective runs
  std::atomic<const char*> armed_what_{nullptr};
  std::atomic<std::int64_t> entered_{0};  // watched collectives entered so far
  std::atomic<bool> firing_{false};       // the deadline passed: the process is ending
  std::mutex channel_mutex_;
  WatchChannel* channel_ = nullptr;
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
