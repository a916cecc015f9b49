#include "runtime/request_queue.h"

#include <chrono>

namespace scaleout {

void RequestQueue::Push(std::shared_ptr<TensorEntry> entry, bool wake) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(std::move(entry));
    pending_.store(true, std::memory_order_release);
  }
  if (wake) cv_.notify_one();
}

void RequestQueue::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    woken_ = true;
    pending_.store(true, std::memory_order_release);
  }
  cv_.notify_one();
}

std::vector<std::shared_ptr<TensorEntry>> RequestQueue::TakeAll() {
  std::vector<std::shared_ptr<TensorEntry>> out;
  // The coordinator polls this in a loop; without work it must not contend for the lock.
  if (!pending_.load(std::memory_order_acquire)) return out;
  std::lock_guard<std::mutex> lock(mu_);
  out.swap(items_);
  woken_ = false;
  pending_.store(false, std::memory_order_release);
  return out;
}

void RequestQueue::WaitForWork(double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
               [&] { return !items_.empty() || woken_; });
}

}  // namespace scaleout
