#include "runtime/handle_table.h"

#include <sched.h>

#include <chrono>
#include <iterator>

namespace scaleout {
namespace {
Status Unknown(int64_t handle) {
  return Status(SO_ERR_UNKNOWN_HANDLE, "handle " + std::to_string(handle) +
                                           " is unknown (never issued, or already released)");
}
}  // namespace

void HandleTable::SetEpoch(int64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  epoch_ = epoch;
  next_handle_ = (epoch << SO_HANDLE_EPOCH_SHIFT) + 1;
}

Status HandleTable::Add(const std::shared_ptr<TensorEntry>& entry) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = entry->is_join ? Open(entry->process_set)
                            : ReserveLocked(entry->process_set, entry->request.name);
  if (!s.ok()) return s;
  entry->handle = next_handle_++;
  slots_[entry->handle].entry = entry;
  return Status::OK();
}

Status HandleTable::Open(int32_t process_set) const {
  if (closed_) return closed_status_;
  auto closed_set = closed_sets_.find(process_set);
  return closed_set != closed_sets_.end() ? closed_set->second : Status::OK();
}

Status HandleTable::ReserveLocked(int32_t process_set, const std::string& name) {
  Status s = Open(process_set);
  if (s.ok() && !names_in_flight_.insert({process_set, name}).second) {
    return Status::DuplicateName("a collective named '" + name +
                                 "' is already in flight on this rank; wait for it before "
                                 "submitting the name again, or use another name");
  }
  return s;
}

bool HandleTable::Reserve(int32_t process_set, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  return ReserveLocked(process_set, name).ok();
}

void HandleTable::Unreserve(int32_t process_set, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  names_in_flight_.erase({process_set, name});
}

void HandleTable::Complete(TensorEntry* entry, const Status& status) {
  CompleteAll({entry}, status);
}

bool HandleTable::FinishLocked(std::unordered_map<int64_t, Slot>::iterator it,
                               const Status& status) {
  if (it->second.done) return false;
  TensorEntry& entry = *it->second.entry;
  entry.finished.store(true, std::memory_order_release);
  if (!entry.is_join) names_in_flight_.erase({entry.process_set, entry.request.name});
  if (it->second.orphaned) {
    slots_.erase(it);
    return false;
  }
  it->second.done = true;
  it->second.status = status;
  return true;
}

void HandleTable::CompleteAll(const std::vector<TensorEntry*>& entries, const Status& status) {
  bool any = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (TensorEntry* entry : entries) {
      if (entry == nullptr) continue;
      auto it = slots_.find(entry->handle);
      if (it != slots_.end()) any = FinishLocked(it, status) || any;
    }
  }
  if (any) cv_.notify_all();
}

void HandleTable::FailAll(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = slots_.begin(); it != slots_.end();) {
      auto next = std::next(it);
      FinishLocked(it, status);
      it = next;
    }
  }
  cv_.notify_all();
}

void HandleTable::CloseSet(int32_t process_set, const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_sets_[process_set] = status;
    for (auto it = slots_.begin(); it != slots_.end();) {
      auto next = std::next(it);
      if (it->second.entry->process_set == process_set) FinishLocked(it, status);
      it = next;
    }
  }
  cv_.notify_all();
}

int HandleTable::Unfinished(int32_t process_set) {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& kv : slots_) {
    n += !kv.second.done && kv.second.entry->process_set == process_set;
  }
  return n;
}

int HandleTable::waiting(int32_t process_set) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = waiting_by_set_.find(process_set);
  return it == waiting_by_set_.end() ? 0 : it->second;
}

void HandleTable::Close(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    closed_status_ = status;
  }
  FailAll(status);
}

Status HandleTable::Poll(int64_t handle, bool* done) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(handle);
  if (it == slots_.end() || it->second.orphaned) return Unknown(handle);
  *done = it->second.done;
  return Status::OK();
}

std::shared_ptr<TensorEntry> HandleTable::Find(int64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(handle);
  return it == slots_.end() ? nullptr : it->second.entry;
}

void HandleTable::Counts(int64_t* handles, int64_t* names) {
  std::lock_guard<std::mutex> lock(mu_);
  *handles = static_cast<int64_t>(slots_.size());
  *names = static_cast<int64_t>(names_in_flight_.size());
}

Status HandleTable::Wait(int64_t handle, double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = slots_.find(handle);
  if (it == slots_.end()) return Unknown(handle);
  if (it->second.done) return it->second.status;
  {
    // Note [Wake-ups]: most collectives complete within microseconds of the wait; yielding
    // until then, for a while, spares the completing thread the wake-up of this one.
    std::shared_ptr<TensorEntry> entry = it->second.entry;
    lock.unlock();
    using Clock = std::chrono::steady_clock;
    const double yield =
        timeout_seconds >= 0 && timeout_seconds < kYieldSeconds ? timeout_seconds : kYieldSeconds;
    const auto until = Clock::now() + std::chrono::duration<double>(yield);
    while (!entry->finished.load(std::memory_order_acquire) && Clock::now() < until)
      ::sched_yield();
    lock.lock();
    it = slots_.find(handle);
    if (it == slots_.end()) return Unknown(handle);
    if (it->second.done) return it->second.status;
  }
  auto done = [&] {
    auto i = slots_.find(handle);
    return i == slots_.end() || i->second.done;
  };
  struct Waiting {  // counted while this thread sleeps here (under mu_, but for n's reads)
    std::atomic<int>& n;
    int& in_set;
    Waiting(std::atomic<int>& count, int& set_count) : n(count), in_set(set_count) {
      ++n, ++in_set;
    }
    ~Waiting() { --n, --in_set; }
  } waiting(waiting_, waiting_by_set_[it->second.entry->process_set]);
  if (timeout_seconds < 0) {
    cv_.wait(lock, done);
  } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_seconds), done)) {
    return Status::Timeout("handle " + std::to_string(handle) + " did not complete within " +
                           std::to_string(timeout_seconds) + " s");
  }
  it = slots_.find(handle);
  if (it == slots_.end()) return Unknown(handle);
  return it->second.status;
}

Status HandleTable::Get(int64_t handle, std::shared_ptr<TensorEntry>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(handle);
  if (it == slots_.end()) return Unknown(handle);
  if (!it->second.done) {
    return Status::InvalidArgument("handle " + std::to_string(handle) + " has not completed yet");
  }
  if (!it->second.status.ok()) return it->second.status;
  *out = it->second.entry;
  return Status::OK();
}

Status HandleTable::Release(int64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(handle);
  if (it == slots_.end() || it->second.orphaned) return Unknown(handle);
  if (it->second.done) {
    slots_.erase(it);
  } else {
    it->second.orphaned = true;
  }
  return Status::OK();
}

}  // namespace scaleout
