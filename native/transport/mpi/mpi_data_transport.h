// DataTransport over MPI collectives on a communicator of its own.
#ifndef SCALEOUT_TRANSPORT_MPI_MPI_DATA_TRANSPORT_H_
#define SCALEOUT_TRANSPORT_MPI_MPI_DATA_TRANSPORT_H_

#include <mpi.h>

#include "transport/data_transport.h"

namespace scaleout {

class MpiDataTransport : public DataTransport {
 public:
  explicit MpiDataTransport(MPI_Comm comm);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override;
  Status Allgatherv(const void* in, size_t in_bytes, void* out,
                    const std::vector<size_t>& recv_bytes) override;
  Status Broadcast(void* buf, size_t bytes, int root) override;
  Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override;
  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                       DataType dtype, ReduceOp op) override;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace scaleout

#endif  // SCALEOUT_TRANSPORT_MPI_MPI_DATA_TRANSPORT_H_
