// The one object that owns a running scaleout instance: configuration, MPI context, transports,
// handle table, request queue and coordinator thread. Created by so_init, destroyed after
// so_shutdown; nothing else in the core is global.
#ifndef SCALEOUT_RUNTIME_RUNTIME_H_
#define SCALEOUT_RUNTIME_RUNTIME_H_

#include <memory>
#include <vector>

#include "common/config.h"
#include "coordinator/coordinator.h"
#include "runtime/handle_table.h"
#include "runtime/peer_liveness.h"
#include "runtime/request_queue.h"
#include "transport/mpi/mpi_context.h"
#include "transport/mpi/mpi_control_channel.h"
#include "transport/mpi/mpi_data_transport.h"
#include "transport/shm/shm_peer_memory.h"

namespace scaleout {

// The arguments of so_enqueue, as received.
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
};

class Runtime {
 public:
  // `epoch` (>= 1) goes into every handle id this runtime issues (SO_HANDLE_EPOCH_SHIFT).
  static Status Create(bool has_comm, int64_t comm_fortran_handle, int64_t epoch,
                       std::shared_ptr<Runtime>* out);
  ~Runtime();

  // Validates the request on this rank and hands it to the coordinator thread.
  Status Enqueue(const EnqueueArgs& args, int64_t* handle);
  void Shutdown();
  // Starts (path not empty) or stops the timeline at run time (Note [Timeline]).
  Status SetTimeline(const std::string& path, bool mark_cycles);

  HandleTable& handles() { return handles_; }
  const Topology& topology() const { return mpi_->topology(); }
  const Config& config() const { return config_; }
  int64_t epoch() const { return handles_.epoch(); }

 private:
  Runtime() = default;
  Status Validate(const EnqueueArgs& a, TensorEntry* entry) const;

  Config config_;
  std::unique_ptr<MpiContext> mpi_;
  std::unique_ptr<PeerLiveness> liveness_;  // Note [Liveness]; before what uses it
  std::unique_ptr<MpiControlChannel> channel_;
  std::vector<std::unique_ptr<MpiDataTransport>> transports_;  // one per endpoint server
  std::unique_ptr<ShmPeerMemory> peers_;  // when every rank is on this machine
  HandleTable handles_;
  RequestQueue queue_;
  // Shared so that SetTimeline, on a user thread, keeps it alive while Shutdown stops it.
  std::mutex coordinator_mu_;
  std::shared_ptr<Coordinator> coordinator_;  // guarded by coordinator_mu_
};

}  // namespace scaleout

#endif  // SCALEOUT_RUNTIME_RUNTIME_H_
