// Communicator: the backend-neutral helpers built on each backend's primitives.
#include "autoaccum/comm/communicator.hpp"

namespace autoaccum::comm {

void Communicator::allreduce_sum(float* data, std::size_t count, const char* what) {
  ++data_allreduce_calls_;
  do_allreduce_sum(data, count, what);
}

void Communicator::allreduce_sum(double* data, std::size_t count, const char* what) {
  ++data_allreduce_calls_;
  do_allreduce_sum(data, count, what);
}

void Communicator::queue_allreduce_sum(float* data, std::size_t count, const char* what) {
  ++data_allreduce_calls_;
  do_queue_allreduce_sum(data, count, what);
}

std::int64_t Communicator::allreduce_max(std::int64_t value) {
  allreduce_max(&value, 1);
  return value;
}

std::int64_t Communicator::allreduce_sum(std::int64_t value) {
  allreduce_sum(&value, 1);
  return value;
}

std::int64_t Communicator::allreduce_min(std::int64_t value) {
  allreduce_min(&value, 1);
  return value;
}

void Communicator::broadcast(std::string& text, int root) {
  auto length = static_cast<std::int64_t>(text.size());
  broadcast(&length, sizeof length, root);
  text.resize(static_cast<std::size_t>(length));
  if (length > 0) broadcast(text.data(), text.size(), root);
}

}  // namespace autoaccum::comm
