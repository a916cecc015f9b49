#include "collectives/endpoint_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

#include "common/logging.h"
#include "common/traffic.h"

namespace scaleout {

namespace {
// Below this many bytes per server a split costs more in thread hand-offs than it gains.
constexpr size_t kMinSplitBytesPerServer = size_t(256) << 10;
}  // namespace

bool PinCurrentThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

EndpointPool::EndpointPool(int k, std::vector<int> cores)
    : k_(k < 1 ? 1 : k), cores_(std::move(cores)) {
  for (int i = 1; i < k_; ++i) threads_.emplace_back([this, i] { Serve(i); });
}

EndpointPool::~EndpointPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void EndpointPool::PinServerZero() const {
  if (!cores_.empty() && !PinCurrentThread(cores_[0])) {
    SO_LOG(kWarning, "could not pin endpoint server 0 to CPU " << cores_[0]);
  }
}

Status EndpointPool::RunSplit(size_t count, size_t esize,
                              const std::function<Status(int, size_t, size_t)>& part) {
  const size_t k = static_cast<size_t>(k_);
  if (k == 1 || count * esize < k * kMinSplitBytesPerServer) return part(0, 0, count);
  const size_t per_line = 64 / esize > 0 ? 64 / esize : 1;
  const size_t share = (count / k + per_line - 1) / per_line * per_line;
  std::vector<Status> results(k);
  const int kind = traffic::Kind();  // Note [Traffic]: the servers work for the caller's kind
  Run([&](int i) {
    traffic::SetKind(kind);
    const size_t begin = std::min(count, share * i);
    const size_t end = i + 1 == k_ ? count : std::min(count, share * (i + 1));
    results[i] = part(i, begin, end);
  });
  for (const Status& s : results) {
    if (!s.ok()) return s;
  }
  return Status::OK();
}

void EndpointPool::Run(const std::function<void(int)>& task) {
  if (k_ > 1) {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &task;
    remaining_ = k_ - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  task(0);
  if (k_ == 1) return;
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return remaining_ == 0; });
  task_ = nullptr;
}

void EndpointPool::Serve(int index) {
  if (index < static_cast<int>(cores_.size()) && !PinCurrentThread(cores_[index])) {
    SO_LOG(kWarning, "could not pin endpoint server " << index << " to CPU " << cores_[index]);
  }
  unsigned long seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const std::function<void(int)>* task = task_;
    lock.unlock();
    (*task)(index);
    lock.lock();
    if (--remaining_ == 0) done_cv_.notify_one();
  }
}

}  // namespace scaleout
