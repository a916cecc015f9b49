// One collective submitted by this rank: its request, the caller's buffers, and its result.
#ifndef SCALEOUT_RUNTIME_TENSOR_ENTRY_H_
#define SCALEOUT_RUNTIME_TENSOR_ENTRY_H_

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "coordinator/message.h"

namespace scaleout {

struct TensorEntry {
  int64_t handle = 0;
  int32_t process_set = 0;  // Note [Process sets]: 0 is every rank
  Request request;
  bool is_join = false;
  const void* input = nullptr;  // caller-owned, alive until completion
  void* output = nullptr;       // caller-owned (allreduce, broadcast) or nullptr
  std::vector<int64_t> splits;  // alltoall: rows to each rank (empty: equal)

  // Written by the coordinator thread before completion; read by callers after it.
  std::vector<uint8_t> result;          // core-owned result (allgather, alltoall, reducescatter)
  std::vector<int64_t> result_shape;
  std::vector<int64_t> received_splits;  // alltoall
  int32_t join_rank = -1;
  double submitted_at = 0;  // monotonic seconds, for stall warnings
  bool stall_reported = false;

};

}  // namespace scaleout

#endif  // SCALEOUT_RUNTIME_TENSOR_ENTRY_H_
