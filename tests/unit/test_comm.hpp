// A communicator for tests of one process: rank `rank` of `size`, whose peers contribute
// nothing (every sum is this process's own values), with every control-plane call a no-op.
// Tests override the data plane to record or change what is sent.
#pragma once

#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"

namespace autoaccum::test {

class TestComm : public comm::Communicator {
 public:
  explicit TestComm(int rank = 0, int size = 1)
      : rank_(rank), size_(size), hosts_(static_cast<std::size_t>(size), "here") {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return rank_; }
  int local_size() const override { return size_; }
  const std::vector<std::string>& hosts() const override { return hosts_; }
  std::string_view backend() const override { return "test"; }
  comm::MemoryKind buffer_memory() const override { return comm::MemoryKind::kHost; }
  void allreduce_max(std::int64_t*, std::size_t) override {}
  void allreduce_sum(std::int64_t*, std::size_t) override {}
  void allreduce_min(std::int64_t*, std::size_t) override {}
  void allreduce_sum_host(double*, std::size_t) override {}
  void allgather(const void*, std::size_t, void*) override {}
  void broadcast(void*, std::size_t, int) override {}
  void barrier() override {}

 protected:
  void do_allreduce_sum(float*, std::size_t, const char*) override {}
  void do_allreduce_sum(double*, std::size_t, const char*) override {}

 private:
  int rank_, size_;
  std::vector<std::string> hosts_;
};

}  // namespace autoaccum::test
