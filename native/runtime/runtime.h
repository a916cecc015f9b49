// The one object that owns a running scaleout instance: configuration, MPI context, transports,
// handle table, request queue and coordinator thread. Created by so_init, destroyed after
// so_shutdown; nothing else in the core is global.
#ifndef SCALEOUT_RUNTIME_RUNTIME_H_
#define SCALEOUT_RUNTIME_RUNTIME_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/data_plane.h"
#include "common/config.h"
#include "coordinator/coordinator.h"
#include "runtime/handle_table.h"
#include "runtime/peer_liveness.h"
#include "runtime/request_queue.h"
#include "transport/mpi/mpi_context.h"
#include "transport/mpi/mpi_control_channel.h"
#include "transport/mpi/mpi_data_transport.h"
#include "transport/shm/shm_control_channel.h"
#include "transport/shm/shm_peer_memory.h"

namespace scaleout {

// A request as the core takes it, from so_enqueue's record (Note [Request record]).
struct EnqueueArgs {
  const char* name = nullptr;
  int collective = SO_ALLREDUCE;
  int dtype = SO_FLOAT32;
  int ndim = 0;
  const int64_t* shape = nullptr;
  const void* input = nullptr;
  void* output = nullptr;
  int reduce_op = SO_AVERAGE;
  int root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  const int64_t* splits = nullptr;
  int nsplits = 0;
  int32_t process_set = 0;    // Note [Process sets]
  bool caller_waits = false;  // Note [Caller drives]
  int32_t priority = 0;       // Note [Priority]
};

// A communicator's data plane and what it is made of, owned (collectives/data_plane.h). Made
// by OwnedDataPlane::Create from the communicator's layout over machines.
struct OwnedDataPlane {
  std::vector<std::unique_ptr<MpiDataTransport>> transports;  // one per endpoint server
  std::unique_ptr<MpiDataTransport> local;  // this machine's ranks: shared memory's bootstrap
  // This local rank on every machine, one per endpoint server.
  std::vector<std::unique_ptr<MpiDataTransport>> cross;
  std::unique_ptr<ShmPeerMemory> peers;
  DataPlane view;

  // `who` names the communicator in warnings ("" for the job's, or "process set 2: ").
  static Status Create(const MpiContext& mpi, const Config& config, PeerLiveness* liveness,
                       const std::string& who, std::unique_ptr<OwnedDataPlane>* out);
};

// Note [Process sets]
// Groups of ranks that run collectives among themselves (Horovod's process sets). Set 0 is every
// rank: made at init like the others, on the job's communicator, and living as long as the
// runtime (it cannot be removed). Others are added and removed collectively, by every rank of
// the job in the same order, and get ids 1, 2, ... in that order. A set may also be made by its
// members alone (AddMemberProcessSet: torch.distributed's new_group, which only the group's
// ranks create), with MPI_Comm_create_group; its id is one none of its members has given out,
// so ids that every rank adds later skip it everywhere, and it lives until shutdown. Each set is a
// job of its own on its members: its own communicators (split from the job's, then duplicated as
// the job's are), negotiation (its first rank negotiates), response cache, fusion, shared memory
// when its ranks share a machine, and its own coordinator thread. So collectives of different sets
// never wait on each other, overlapping sets included (one thread per set: no order between sets to
// deadlock on), and names are scoped per set. Liveness is the job's: a death anywhere ends every
// set.
struct ProcessSet {
  ProcessSetInfo info;  // id and the job's rank of each member (set 0: 0, 1, ..., size - 1)
  int rank = -1;        // this rank's place in it; -1: not a member (nothing below is made)
  std::unique_ptr<MpiContext> mpi;
  std::unique_ptr<ControlChannel> channel;  // MPI, or shared memory on one machine
  std::unique_ptr<OwnedDataPlane> plane;
  RequestQueue queue;
  std::shared_ptr<Coordinator> coordinator;
};

class Runtime {
 public:
  // `epoch` (>= 1) goes into every handle id this runtime issues (SO_HANDLE_EPOCH_SHIFT).
  static Status Create(bool has_comm, int64_t comm_c_handle, int64_t epoch,
                       std::shared_ptr<Runtime>* out);
  ~Runtime();

  // Validates the request on this rank and hands it to the coordinator thread.
  Status Enqueue(const EnqueueArgs& args, int64_t* handle);
  // Waits for the handle (timeout < 0: forever), first running its collective on this thread
  // when its caller said it waits at once (Note [Caller drives]).
  Status Wait(int64_t handle, double timeout_seconds);
  // Note [Fast lane]: runs a synchronous allreduce of the global set on this thread at once,
  // with no handle, when the lane can take it: *done true when it ran (the returned status is
  // its outcome), false when nothing was done (then Enqueue and Wait it as usual, which also
  // explain whatever is wrong with it).
  Status AllreduceNow(const EnqueueArgs& args, bool* done);
  void Shutdown();
  // Starts (path not empty) or stops the timeline at run time (Note [Timeline]).
  Status SetTimeline(const std::string& path, bool mark_cycles);
  // Note [Process sets]: collective over every rank of the job, in the same order everywhere.
  // `ranks`: the job's ranks of the new set. *id: its id.
  Status AddProcessSet(const std::vector<int>& ranks, int32_t* id);
  // Collective over the set's ranks only (torch's new_group: only members create a group). A
  // set with these ranks that exists already is returned; a new one is removed only at shutdown.
  Status AddMemberProcessSet(const std::vector<int>& ranks, int32_t* id);
  // Fails, changing nothing, while any rank has collectives of the set in flight.
  Status RemoveProcessSet(int32_t id);
  // A set's ranks (the job's) and this rank's place in it (-1 if not a member).
  Status DescribeProcessSet(int32_t id, std::vector<int>* ranks, int* rank) const;

  HandleTable& handles() { return handles_; }
  const Topology& topology() const { return mpi().topology(); }
  const Config& config() const { return config_; }
  // The job's algorithm plan (the global set's; Note [Algorithm plan]).
  const AlgorithmPlan& plan() const { return global_->plane->view.plan; }
  int64_t epoch() const { return handles_.epoch(); }

 private:
  Runtime() = default;
  Status Validate(const EnqueueArgs& a, int size, TensorEntry* entry) const;
  // Rank 0 opens HOROVOD_AUTOTUNE_LOG; every rank fails init if it cannot (Note [Autotune]).
  Status OpenAutotuneLog();
  // Makes the set's data plane, control channel and coordinator over set->mpi, and starts it.
  Status StartProcessSet(ProcessSet* set);
  // Stops the set's coordinator (its pending work fails) and lets its resources go.
  void StopProcessSet(ProcessSet* set);
  void StopCoordinator(ProcessSet* set);
  // The set with this id (the global set's without taking a lock), or nullptr.
  std::shared_ptr<ProcessSet> FindSet(int32_t id) const;
  // The job's MPI, the global set's: topology, liveness and set changes run on it.
  const MpiContext& mpi() const { return *global_->mpi; }

  Config config_;
  // Set 0 (Note [Process sets]); also in sets_. Declared before what uses its communicators.
  std::shared_ptr<ProcessSet> global_;
  std::unique_ptr<PeerLiveness> liveness_;  // Note [Liveness]; before what uses it
  HandleTable handles_;
  int coordinator_core_ = -1;
  std::unique_ptr<std::ostream> autotune_log_;  // rank 0's, until the global set starts
  // Guards each set's coordinator pointer: SetTimeline, on a user thread, keeps the global
  // set's alive while Shutdown stops it.
  std::mutex coordinators_mu_;
  // Note [Process sets]: one change at a time; lookups from any thread.
  std::mutex change_mu_;
  mutable std::mutex sets_mu_;
  std::map<int32_t, std::shared_ptr<ProcessSet>> sets_;  // guarded by sets_mu_; set 0 too
  int32_t next_set_id_ = 1;                              // guarded by change_mu_
};

}  // namespace scaleout

#endif  // SCALEOUT_RUNTIME_RUNTIME_H_
