// The collective watchdog: the deadline, its thread, and the line a timeout prints.
#include "autoaccum/comm/watchdog.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

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

TimeoutReport tally(int self, const WatchState& mine,
                    const std::vector<std::optional<WatchState>>& answers) {
  TimeoutReport report;
  report.rank = self;
  for (int r = 0; r < static_cast<int>(answers.size()); ++r) {
    const std::optional<WatchState>& answer =
        r == self ? std::optional<WatchState>(mine) : answers[static_cast<std::size_t>(r)];
    if (!answer)
      report.silent.push_back(r);
    else if (answer->collective < 0)
      report.running.push_back(r);
    else if (std::abs(answer->collective - mine.collective) <= 1)
      report.present.push_back(r);  // one collective apart: one of them finished it first
    else
      report.elsewhere.push_back(r);
  }
  return report;
}

std::string describe_timeout(const TimeoutReport& report) {
  std::ostringstream out;
  out << "collective timeout: ";
  const std::string within = " within " + duration_text(report.timeout) + " (--collective-timeout)";
  const std::string& context = report.context;
  if (!report.located) {
    out << report.collective << " did not complete" << within << " on rank " << report.rank
        << "; which ranks are missing is not known (this MPI gives no MPI_THREAD_MULTIPLE)";
    if (!context.empty()) out << "; " << context;
    return out.str();
  }
  if (report.running.empty() && report.silent.empty() && report.elsewhere.empty()) {
    out << "every rank reached " << report.collective << ", but it did not complete" << within
        << ": a link or a rank failed inside it";
    if (!context.empty()) out << ", " << context;
    return out.str();
  }
  // Ranks grouped by host: a dead node shows as one entry.
  const auto by_host = [&](const std::vector<int>& ranks) {
    std::map<std::string, std::vector<int>> hosts;
    for (int r : ranks) {
      const auto index = static_cast<std::size_t>(r);
      hosts[index < report.hosts.size() ? report.hosts[index] : "?"].push_back(r);
    }
    std::string text = plural(ranks);
    bool first = true;
    for (const auto& [host, on_host] : hosts) {
      text += (first ? "" : ", ") + rank_ranges(on_host) + " on " + host;
      first = false;
    }
    return text;
  };
  out << report.collective << " did not complete" << within << ":";
  std::string separator = " ";
  if (!report.running.empty()) {
    out << separator << by_host(report.running) << " did not reach it (still running)";
    separator = "; ";
  }
  if (!report.silent.empty()) {
    out << separator << by_host(report.silent) << (report.silent.size() == 1 ? " does" : " do")
        << " not answer (process, node or link down)";
    separator = "; ";
  }
  if (!report.elsewhere.empty()) {
    out << separator << plural(report.elsewhere) << rank_ranges(report.elsewhere)
        << " waited in a different collective";
    separator = "; ";
  }
  if (!report.present.empty())
    out << separator << plural(report.present) << rank_ranges(report.present) << " waited";
  if (!context.empty()) out << "; " << context;
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
  // Once the watchdog fires it runs a copy of the last words, which may point into the caller's
  // state: the caller must not go on to destroy it. The process ends with the abort.
  park_if_firing();
  std::lock_guard<std::mutex> lock(context_mutex_);
  last_words_ = std::move(last_words);
}

void Watchdog::park_if_firing() const noexcept {
  while (firing_.load())
    std::this_thread::sleep_for(std::chrono::seconds(1));
}

void Watchdog::attach(WatchChannel* channel) {
  std::lock_guard<std::mutex> lock(channel_mutex_);
  if (!channel_) channel_ = channel;
}

void Watchdog::detach(WatchChannel* channel) {
  std::lock_guard<std::mutex> lock(channel_mutex_);
  if (channel_ == channel) channel_ = nullptr;
}

Watchdog::Guard::Guard(Watchdog& dog, const char* what) noexcept : dog_(dog) {
  // A main thread whose collective completed while the watchdog was already firing (a late rank
  // arrived in the grace period) goes no further: the job is ending.
  dog_.park_if_firing();
  dog_.entered_.fetch_add(1, std::memory_order_relaxed);
  dog_.armed_what_.store(what, std::memory_order_relaxed);
  dog_.armed_at_ns_.store(now_ns(), std::memory_order_release);
}

Watchdog::Guard::~Guard() {
  dog_.armed_at_ns_.store(0, std::memory_order_release);
}

WatchState Watchdog::state() const {
  const std::int64_t armed = armed_at_ns_.load(std::memory_order_acquire);
  if (armed == 0) return {};
  return {entered_.load(std::memory_order_relaxed), (now_ns() - armed) / 1'000'000};
}

void Watchdog::answer_announcements(WatchChannel& channel) const {
  int from = -1;
  while (channel.next_announcement(from))
    channel.answer(from, state());
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(thread_mutex_);
  const std::int64_t timeout_ns = timeout_ms_.load() * 1'000'000;
  // Answers the other ranks' questions within a tenth of a second; fires within 25% of the
  // deadline.
  const auto period =
      std::clamp(Milliseconds(timeout_ms_.load() / 4), Milliseconds(10), Milliseconds(100));
  while (!stop_) {
    wake_.wait_for(lock, period);
    if (stop_) break;
    {
      std::lock_guard<std::mutex> hold(channel_mutex_);
      if (channel_) answer_announcements(*channel_);
    }
    const std::int64_t armed = armed_at_ns_.load(std::memory_order_acquire);
    if (armed != 0 && now_ns() - armed > timeout_ns) fire(armed_what_.load());
  }
}

void Watchdog::fire(const char* what) {
  firing_.store(true);
  TimeoutReport report;
  const WatchState mine = state();
  {
    // Ask every other rank's thread where its rank is; answer theirs meanwhile (the others
    // that timed out ask too). Return codes are ignored: a peer that is gone must not hide the
    // timeout behind a send error. The channel stays held: the process ends below.
    std::lock_guard<std::mutex> hold(channel_mutex_);
    if (channel_) {
      WatchChannel& channel = *channel_;
      std::vector<std::optional<WatchState>> answers(static_cast<std::size_t>(channel.size()));
      channel.announce(mine);
      int heard = 1;
      const auto until = std::chrono::steady_clock::now() + grace_period(timeout());
      while (heard < channel.size() && std::chrono::steady_clock::now() < until) {
        answer_announcements(channel);
        int from = -1;
        while (const auto answer = channel.next_answer(from)) {
          auto& slot = answers.at(static_cast<std::size_t>(from));
          if (!slot) ++heard;
          slot = answer;
        }
        std::this_thread::sleep_for(Milliseconds(1));
      }
      report = tally(channel.rank(), mine, answers);
      report.hosts = channel.hosts();
    } else {
      report.located = false;
      report.rank = rank_;
    }
  }
  report.collective = what ? what : "a collective";
  report.timeout = timeout();
  std::function<void(const std::string&)> last_words;
  {
    std::lock_guard<std::mutex> lock(context_mutex_);
    report.context = context_;
    last_words = last_words_;
  }
  const std::string message = describe_timeout(report);
  // One line from the job: the lowest rank that waited (without a channel, every rank that
  // timed out says its own).
  const bool reporter =
      !report.located || (!report.present.empty() && report.present.front() == report.rank);
  if (reporter) core::write_line(stderr, "autoaccum: error: " + message);
  if (last_words) {
    // On a thread of their own, with a deadline: a hung file system (often what stalled the
    // collective) must not keep the abort below from ending the job.
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread([last_words, message, done] {
      try {
        last_words(message);
      } catch (...) {
      }
      done->store(true);
    }).detach();
    const auto until = std::chrono::steady_clock::now() + kLastWordsDeadline;
    while (!done->load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(Milliseconds(10));
    if (!done->load())
      core::write_line(stderr, "autoaccum: rank " + std::to_string(rank_) +
                                   ": warning: the run log could not be written within " +
                                   duration_text(kLastWordsDeadline) +
                                   " (a hung file system?); ending the job without it");
  }
  // One MPI_Abort for the job: the reporter's. The launcher ends every other rank with it; a
  // second abort racing with that teardown has crashed Open MPI 4.1's mpiexec (in its PMIx
  // server's finalize). The others abort themselves only as a fallback, when the reporter's
  // abort has not reached the launcher (its node gone) after kNonReporterAbortDelay.
  if (!reporter) std::this_thread::sleep_for(kNonReporterAbortDelay);
  // The main thread is stuck inside MPI; MPI_Abort from this thread is allowed under
  // MPI_THREAD_MULTIPLE (without it, it is outside what MPI promises, but it is the one call that
  // makes the launcher end the whole job even when a node cannot be reached). If it returns, a
  // process that ends without MPI_Finalize still makes the launcher end the others.
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
