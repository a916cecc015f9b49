// One collective submitted by this rank: its request, the caller's buffers, and its result.
#ifndef SCALEOUT_RUNTIME_TENSOR_ENTRY_H_
#define SCALEOUT_RUNTIME_TENSOR_ENTRY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "common/status.h"
#include "coordinator/message.h"
#include "runtime/result_memory.h"

namespace scaleout {

// An allocator whose resize leaves new elements uninitialized: a result is written whole before
// anyone reads it, so zero-filling it first would only cost a pass over the memory. Its memory
// comes from result_memory (Note [Result memory]).
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(result_memory::Allocate(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { result_memory::Release(p, n * sizeof(T)); }
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// A core-owned result's bytes; handed to the caller whole (so_result_take), not copied.
using ResultBytes = std::vector<uint8_t, UninitializedAllocator<uint8_t>>;

struct TensorEntry {
  int64_t handle = 0;
  int32_t process_set = 0;  // Note [Process sets]: 0 is every rank
  Request request;
  bool is_join = false;
  const void* input = nullptr;  // caller-owned, alive until completion
  void* output = nullptr;       // caller-owned (allreduce, broadcast) or nullptr
  std::vector<int64_t> splits;  // alltoall: rows to each rank (empty: equal)

  // Written by the coordinator thread before completion; read by callers after it.
  ResultBytes result;  // core-owned result (allgather, alltoall, reducescatter)
  std::vector<int64_t> result_shape;
  std::vector<int64_t> received_splits;  // alltoall
  int32_t join_rank = -1;
  double submitted_at = 0;  // monotonic seconds, for stall warnings
  bool stall_reported = false;
  // Note [Caller drives]: the submitting thread waits on it at once and may run the collective
  // itself; `driven` is set by the first wait that tries.
  bool caller_waits = false;
  std::atomic<bool> driven{false};
  std::atomic<bool> finished{false};  // completed (set by the handle table), for a lock-free look
};

}  // namespace scaleout

#endif  // SCALEOUT_RUNTIME_TENSOR_ENTRY_H_
