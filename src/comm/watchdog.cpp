// The collective watchdog: the deadline, its thread, and the line a timeout prints.
#include "autoaccum/comm/watchdog.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "autoaccum/core/console.hpp"
#include "autoaccum/core/error.hpp"

namespace autoaccum::comm {
namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string plural(const std::vector<int>& ranks) {
  return ranks.size() == 1 ? "rank " : "ranks ";
}

}  // namespace

std::string rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::ostringstream out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
      ++j;
    if (i > 0) out << ", ";
    out << ranks[i];
    if (j > i) out << (j == i + 1 ? ", " : "-") << ranks[j];
    i = j + 1;
  }
  return out.str();
}

std::string duration_text(Milliseconds duration) {
  const double seconds = static_cast<double>(duration.count()) / 1000.0;
  std::ostringstream out;
  if (seconds >= 120 && std::fmod(seconds, 60.0) == 0)
    out << seconds / 60 << " min";
  else
    out << seconds << " s";
  return out.str();
}

Milliseconds grace_period(Milliseconds timeout) {
  return std::clamp(timeout / 10, Milliseconds(1000), Milliseconds(10000));
}

std::string describe_timeout(const TimeoutReport& report) {
  std::ostringstream out;
  out << "collective timeout: ";
  if (report.absent.empty()) {
    out << "every rank reached " << report.collective << ", but it did not complete within "
        << duration_text(report.timeout)
        << " (--collective-timeout): a link or a rank failed inside it";
  } else {
    // The absent ranks, grouped by host: a dead node shows as one entry.
    std::map<std::string, std::vector<int>> by_host;
    for (int r : report.absent) {
      const auto index = static_cast<std::size_t>(r);
      by_host[index < report.hosts.size() ? report.hosts[index] : "?"].push_back(r);
    }
    out << plural(report.absent);
    bool first = true;
    for (const auto& [host, ranks] : by_host) {
      out << (first ? "" : ", ") << rank_ranges(ranks) << " on " << host;
      first = false;
    }
    out << " did not reach " << report.collective << " within " << duration_text(report.timeout)
        << " (--collective-timeout; " << plural(report.present) << rank_ranges(report.present)
        << " waited)";
  }
  if (!report.elsewhere.empty()) {
    out << "; " << plural(report.elsewhere) << rank_ranges(report.elsewhere)
        << " answered from a different collective";
  }
  if (!report.context.empty()) out << (report.absent.empty() ? ", " : " ") << report.context;
  return out.str();
}

Watchdog::~Watchdog() {
  stop_thread();
}

void Watchdog::configure(Milliseconds timeout, int rank) {
  stop_thread();
  rank_ = rank;
  timeout_ms_.store(std::max<std::int64_t>(0, timeout.count()));
  if (timeout.count() <= 0) return;
  {
    std::lock_guard<std::mutex> lock(thread_mutex_);
    stop_ = false;
  }
  thread_ = std::thread([this] { watch(); });
}

void Watchdog::stop_thread() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(thread_mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::set_context(std::string context) {
  std::lock_guard<std::mutex> lock(context_mutex_);
  context_ = std::move(context);
}

std::string Watchdog::context() const {
  std::lock_guard<std::mutex> lock(context_mutex_);
  return context_;
}

void Watchdog::set_last_words(std::function<void(const std::string&)> last_words) {
  std::lock_guard<std::mutex> lock(context_mutex_);
  last_words_ = std::move(last_words);
}

Watchdog::Guard::Guard(Watchdog& dog, const char* what) noexcept : dog_(dog) {
  dog_.armed_what_.store(what, std::memory_order_relaxed);
  dog_.armed_at_ns_.store(now_ns(), std::memory_order_release);
}

Watchdog::Guard::~Guard() {
  dog_.armed_at_ns_.store(0, std::memory_order_release);
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(thread_mutex_);
  const std::int64_t timeout_ns = timeout_ms_.load() * 1'000'000;
  // Checks a few times per deadline (at most every second), so it fires within 25% of it.
  const auto period =
      std::clamp(Milliseconds(timeout_ms_.load() / 4), Milliseconds(10), Milliseconds(1000));
  while (!stop_) {
    wake_.wait_for(lock, period);
    if (stop_) break;
    const std::int64_t armed = armed_at_ns_.load(std::memory_order_acquire);
    if (armed != 0 && now_ns() - armed > timeout_ns) fire(armed_what_.load());
  }
}

void Watchdog::fire(const char* what) {
  TimeoutReport report;
  report.collective = what ? what : "a collective";
  report.timeout = timeout();
  std::function<void(const std::string&)> last_words;
  {
    std::lock_guard<std::mutex> lock(context_mutex_);
    report.context = context_;
    last_words = last_words_;
  }
  const std::string message = describe_timeout(report);
  core::write_line(stderr, "autoaccum: rank " + std::to_string(rank_) + ": error: " + message);
  if (last_words) {
    try {
      last_words(message);
    } catch (...) {
    }
  }
  // The main thread is stuck inside MPI. MPI_Abort from this thread is outside what
  // MPI_THREAD_FUNNELED promises, but it is the one call that makes the launcher end the whole
  // job even when a node cannot be reached (srun otherwise waits until Slurm declares that node
  // dead, minutes later); Open MPI's goes through PMIx, which has its own thread. If it returns,
  // a process that ends without MPI_Finalize still makes mpirun end the others.
  const int code = static_cast<int>(ExitCode::kCollectiveTimeout);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

Watchdog& watchdog() {
  static Watchdog dog;
  return dog;
}

}  // namespace autoaccum::comm
