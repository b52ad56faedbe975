// Communicator: the backend-neutral helpers built on each backend's primitives.
#include "autoaccum/comm/communicator.hpp"

#include <algorithm>

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

void Communicator::reduce_scatter_sum(float* data, std::size_t chunk, const char* what) {
  ++data_allreduce_calls_;
  do_reduce_scatter_sum(data, chunk, what);
}

void Communicator::reduce_sum(float* data, std::size_t count, int root, const char* what) {
  ++data_allreduce_calls_;
  do_reduce_sum(data, count, root, what);
}

void Communicator::queue_reduce_sum(float* data, std::size_t count, int root, const char* what) {
  ++data_allreduce_calls_;
  do_queue_reduce_sum(data, count, root, what);
}

void Communicator::allgather_in_place(float* data, std::size_t chunk, const char* what) {
  ++data_allgather_calls_;
  do_allgather_in_place(data, chunk, what);
}

void Communicator::do_reduce_scatter_sum(float* data, std::size_t chunk, const char* what) {
  do_allreduce_sum(data, chunk * static_cast<std::size_t>(size()), what);
}

void Communicator::do_allgather_in_place(float* data, std::size_t chunk, const char* what) {
  const auto mine = static_cast<std::size_t>(rank()) * chunk;
  const std::size_t all = chunk * static_cast<std::size_t>(size());
  std::fill(data, data + mine, 0.0f);
  std::fill(data + mine + chunk, data + all, 0.0f);
  do_allreduce_sum(data, all, what);
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
