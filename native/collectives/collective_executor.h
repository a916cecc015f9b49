// Executes agreed responses on this rank: packs tensors into the fusion buffer, widens half
// precision, applies scale factors and the Average division, asks the DataTransport to move and
// reduce the bytes, and unpacks results. Knows nothing of MPI.
//
// Threading: coordinator thread only.
#ifndef SCALEOUT_COLLECTIVES_COLLECTIVE_EXECUTOR_H_
#define SCALEOUT_COLLECTIVES_COLLECTIVE_EXECUTOR_H_

#include <vector>

#include <memory>

#include "collectives/adasum.h"
#include "collectives/data_plane.h"
#include "collectives/endpoint_pool.h"
#include "collectives/fast_lane.h"
#include "collectives/hierarchical_allgather.h"
#include "collectives/machine_reduce.h"
#include "collectives/staged_allgather.h"
#include "collectives/staged_allreduce.h"
#include "collectives/staged_alltoall.h"
#include "collectives/staged_broadcast.h"
#include "coordinator/message.h"
#include "fusion/fused_tensors.h"
#include "fusion/fusion_buffer.h"
#include "runtime/tensor_entry.h"
#include "transport/data_transport.h"

namespace scaleout {

class CollectiveExecutor {
 public:
  // plane.transports[i] belongs to endpoint server i of `endpoints` (at least one).
  // Makes the algorithms plane.plan names (Note [Algorithm plan]).
  CollectiveExecutor(const DataPlane& plane, EndpointPool* endpoints);

  // entries[i] is this rank's entry for response.tensors[i], or nullptr where this rank joined
  // instead of submitting (it then contributes zeros or no rows). Results go into the entries.
  Status Execute(const Response& response, const std::vector<TensorEntry*>& entries);

  // Note [Fast lane]: this communicator's lane (null where its allreduce is not staged through
  // shared memory on one machine), and `response`, one allreduce of `entry` alone with no
  // prescale (the caller's to check: it knows what `post` compares), run on it if its op and
  // size fit and every rank agrees (*agreed); else nothing is done.
  FastLane* lane() const { return lane_.get(); }
  Status RunOnLane(const Response& response, TensorEntry* entry, const LanePost& post,
                   bool* agreed);

 private:
  Status Run(const Response& r, const std::vector<TensorEntry*>& entries);  // by collective
  Status Allreduce(const Response& r, const std::vector<TensorEntry*>& entries);
  Status MachinesAdasum(const Response& r, const FusedTensors& fused);
  Status Allgather(const Response& r, const std::vector<TensorEntry*>& entries);
  Status Broadcast(const Response& r, TensorEntry* entry);
  Status Alltoall(const Response& r, TensorEntry* entry);
  Status ReduceScatter(const Response& r, TensorEntry* entry);

  // Allreduce of count elements, split across the endpoint servers when large enough.
  Status ReduceSplit(const void* in, void* out, size_t count, DataType dtype, ReduceOp op);

  // transports_[0] (endpoint server 0's) carries every collective that is not split.
  std::vector<DataTransport*> transports_;
  EndpointPool* endpoints_;
  Adasum adasum_;
  std::unique_ptr<MachineReduce> machines_;  // before staged_, which uses it
  std::unique_ptr<StagedAllreduce> staged_;
  std::unique_ptr<FastLane> lane_;  // Note [Fast lane]
  std::unique_ptr<StagedAlltoall> alltoall_;
  std::unique_ptr<StagedBroadcast> staged_broadcast_;
  std::unique_ptr<StagedAllgather> staged_allgather_;
  std::unique_ptr<HierarchicalAllgather> hierarchical_allgather_;
  // Note [Hierarchical Adasum]: sums inside this machine (every rank, with machines_adasum_),
  // and Adasum over the machines' first ranks (only on a machine's first rank).
  std::unique_ptr<StagedAllreduce> machine_sum_;
  std::unique_ptr<Adasum> machine_adasum_;

  // Allgatherv over the whole communicator, hierarchical across machines when it can be.
  Status Allgatherv(const void* in, size_t in_bytes, void* out,
                    const std::vector<size_t>& recv_bytes);
  FusionBuffer fusion_;
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_COLLECTIVE_EXECUTOR_H_
