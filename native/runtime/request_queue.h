// Hands entries from the callers' threads to the coordinator thread, and wakes it.
//
// Threading: Push from any thread; TakeAll from the thread running the coordinator (its own, or a
// caller driving it: Note [Caller drives]); WaitForWork from the coordinator thread only.
#ifndef SCALEOUT_RUNTIME_REQUEST_QUEUE_H_
#define SCALEOUT_RUNTIME_REQUEST_QUEUE_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/tensor_entry.h"

namespace scaleout {

class RequestQueue {
 public:
  // `wake` false leaves a sleeping coordinator asleep: the caller runs it (Note [Caller drives]);
  // it still finds the entry at its next periodic wake.
  void Push(std::shared_ptr<TensorEntry> entry, bool wake = true);
  // Wakes the coordinator without work (shutdown).
  void Wake();
  std::vector<std::shared_ptr<TensorEntry>> TakeAll();
  bool HasWork() const { return pending_.load(std::memory_order_acquire); }
  // Sleeps until work arrives, Wake() is called, or the timeout passes.
  void WaitForWork(double timeout_seconds);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<TensorEntry>> items_;
  std::atomic<bool> pending_{false};
  bool woken_ = false;
};

}  // namespace scaleout

#endif  // SCALEOUT_RUNTIME_REQUEST_QUEUE_H_
