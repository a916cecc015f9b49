// Handles given to callers, and the completion of the collectives behind them.
//
// Threading: every method is thread-safe. Callers enqueue and wait on any thread; the
// coordinator thread completes. An entry stays alive (shared_ptr) while either side holds it.
#ifndef SCALEOUT_RUNTIME_HANDLE_TABLE_H_
#define SCALEOUT_RUNTIME_HANDLE_TABLE_H_

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "runtime/tensor_entry.h"

namespace scaleout {

class HandleTable {
 public:
  // Ids issued from now on carry `epoch` (see SO_HANDLE_EPOCH_SHIFT). Call before any Add.
  void SetEpoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // Registers the entry and reserves its name; DuplicateName if the name is in flight.
  Status Add(const std::shared_ptr<TensorEntry>& entry);
  // The name alone, for a collective that runs without a handle (Runtime::AllreduceNow): false
  // if it is in flight or the table is closed to the set (Add then says which).
  bool Reserve(int32_t process_set, const std::string& name);
  void Unreserve(int32_t process_set, const std::string& name);
  // Marks the entry done with `status` and wakes its waiters; frees its name.
  void Complete(TensorEntry* entry, const Status& status);
  // The same for several entries, waking waiters once (a fused response completes many).
  void CompleteAll(const std::vector<TensorEntry*>& entries, const Status& status);
  // Completes every registered, unfinished entry with `status` (used at shutdown).
  void FailAll(const Status& status);
  // FailAll, and from now on Add refuses new entries with `status` (the coordinator stopped).
  void Close(const Status& status);
  // The same for the entries of one process set (its coordinator stopped; Note [Process sets]).
  void CloseSet(int32_t process_set, const Status& status);
  // Entries of the set not completed yet.
  int Unfinished(int32_t process_set);

  Status Poll(int64_t handle, bool* done);
  // The registered entry behind the handle, done or not (nullptr if unknown).
  std::shared_ptr<TensorEntry> Find(int64_t handle);
  // Handles registered (issued and not released) and names in flight, for leak checks.
  void Counts(int64_t* handles, int64_t* names);
  // Threads inside Wait now (Note [Deadlock]), in all and on handles of one process set.
  int waiting() const { return waiting_.load(std::memory_order_relaxed); }
  int waiting(int32_t process_set);
  // Blocks until done (timeout < 0: forever); returns the entry's status. Yields for up to
  // kYieldSeconds before it sleeps (Note [Wake-ups]).
  Status Wait(int64_t handle, double timeout_seconds);
  static constexpr double kYieldSeconds = 100e-6;
  // The completed entry (nullptr and an error status if unknown or not finished).
  Status Get(int64_t handle, std::shared_ptr<TensorEntry>* out);
  // Frees the handle. A pending one is orphaned: its name stays reserved (the collective still
  // runs on every rank) until it completes, then the slot is dropped.
  Status Release(int64_t handle);

 private:
  struct Slot {
    std::shared_ptr<TensorEntry> entry;
    bool done = false;
    bool orphaned = false;  // released while pending: dropped when it completes
    Status status;
  };
  // OK, or why the table takes nothing more for the set (closed). Caller holds mu_.
  Status Open(int32_t process_set) const;
  // Open, and the name reserved: DuplicateName if it is in flight. Caller holds mu_.
  Status ReserveLocked(int32_t process_set, const std::string& name);
  // Marks one slot done; erases it if orphaned. Caller holds mu_. Returns whether it changed.
  bool FinishLocked(std::unordered_map<int64_t, Slot>::iterator it, const Status& status);
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> waiting_{0};
  std::map<int32_t, int> waiting_by_set_;  // guarded by mu_
  int64_t epoch_ = 0;
  int64_t next_handle_ = 1;
  std::unordered_map<int64_t, Slot> slots_;
  // Names are scoped by process set: (set, name).
  struct NameHash {
    size_t operator()(const std::pair<int32_t, std::string>& k) const {
      return std::hash<std::string>()(k.second) * 31 + static_cast<size_t>(k.first);
    }
  };
  std::unordered_set<std::pair<int32_t, std::string>, NameHash> names_in_flight_;
  bool closed_ = false;
  Status closed_status_;
  std::map<int32_t, Status> closed_sets_;
};

}  // namespace scaleout

#endif  // SCALEOUT_RUNTIME_HANDLE_TABLE_H_
