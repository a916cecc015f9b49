// DataTransport over MPI collectives on a communicator of its own.
#ifndef SCALEOUT_TRANSPORT_MPI_MPI_DATA_TRANSPORT_H_
#define SCALEOUT_TRANSPORT_MPI_MPI_DATA_TRANSPORT_H_

#include <functional>

#include "mpi/so_mpi.h"
#include "transport/data_transport.h"

namespace scaleout {

// Note [Interruptible waits]
// Each collective is started nonblocking and waited for by polling MPI, as MPI's blocking calls
// do internally (measured with mpi4py at 2 ranks, 1 KiB to 4 MiB: the same times), so that the
// wait can give up: every kPollsPerCheck polls it asks `interrupted`, which says when a peer has
// died (Note [Liveness]) and the collective can never complete; between checks it yields the
// core, sleeping briefly when `sleepy` (the MPI was asked to: MPIR_CVAR_ENABLE_HEAVY_YIELD or
// OMPI_MCA_mpi_yield_when_idle). A collective given up leaves the communicator unusable: every
// later call fails at once with the same error.
class MpiDataTransport : public DataTransport {
 public:
  using Interrupted = std::function<Status()>;
  MpiDataTransport(so_mpi_handle comm, Interrupted interrupted, bool sleepy);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override;
  Status Allgatherv(const void* in, size_t in_bytes, void* out,
                    const std::vector<size_t>& recv_bytes) override;
  Status Broadcast(void* buf, size_t bytes, int root) override;
  Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes,
                   const std::vector<size_t>& send_at, void* out,
                   const std::vector<size_t>& recv_bytes,
                   const std::vector<size_t>& recv_at) override;
  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                       ReduceOp op) override;
  Status Sendrecv(const void* send, size_t bytes, int peer, void* recv) override;

 private:
  Status Wait(so_mpi_handle* request, const char* what);
  // Allreduce as ReduceScatter then Allgatherv (halves: Note [Halves on the wire]).
  Status ReduceScatterAllgather(const void* in, void* out, size_t count, DataType dtype,
                                ReduceOp op);

  so_mpi_handle comm_;
  Interrupted interrupted_;
  bool sleepy_;
  Status broken_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<uint8_t> part_;  // ReduceScatterAllgather's reduced block
};

}  // namespace scaleout

#endif  // SCALEOUT_TRANSPORT_MPI_MPI_DATA_TRANSPORT_H_
