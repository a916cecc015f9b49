// The MPI side of a runtime: communicators duplicated from the user's one (so scaleout's
// traffic never mixes with the user's), and the rank layout across and within nodes.
#ifndef SCALEOUT_TRANSPORT_MPI_MPI_CONTEXT_H_
#define SCALEOUT_TRANSPORT_MPI_MPI_CONTEXT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "transport/mpi/mpi_api.h"

namespace scaleout {

struct Topology {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  int machines = 1;        // machines the communicator spans (every rank knows the same)
  bool uniform = true;     // every machine has the same number of ranks
  int max_local_size = 1;  // ranks on the largest machine
  // Per rank of the communicator: its machine (the cross rank of the machine's first rank)
  // and its local rank there.
  std::vector<int> machine_of, local_rank_of;
};

class MpiContext {
 public:
  // Initialises MPI when nobody has (checking the thread level either way) and gives the
  // communicator with that C handle (mpi4py's Comm.handle), or MPI_COMM_WORLD when !has_comm.
  static Status StartMpi(bool has_comm, int64_t comm_c_handle, so_mpi_handle* user);
  // Runs on `user` (a communicator of the shim in use, not freed here).
  // `data_channels` communicators are made for the data plane (one per endpoint server). Every
  // rank must ask for the same number, and give the same value for each of `agreed` (settings
  // named by their variable): checked here, an error naming the variable on every rank otherwise.
  static Status Create(so_mpi_handle user, int data_channels,
                       const std::vector<std::pair<std::string, int64_t>>& agreed,
                       std::unique_ptr<MpiContext>* out);
  ~MpiContext();

  so_mpi_handle control_comm() const { return control_; }
  so_mpi_handle local_comm() const { return local_; }  // the ranks of this machine
  // For collectives on user threads (making process sets), never the coordinator's.
  so_mpi_handle admin_comm() const { return admin_; }
  so_mpi_handle data_comm(int i = 0) const { return data_[i]; }
  // Data communicators of this machine's ranks, and of the ranks with this local rank on every
  // machine (one per data channel: Note [Hierarchical allreduce], Note [Endpoint servers]).
  // Made only when the communicator spans machines.
  so_mpi_handle local_data_comm() const { return local_data_; }
  so_mpi_handle cross_data_comm(int i = 0) const { return cross_data_[i]; }
  int data_channels() const { return static_cast<int>(data_.size()); }
  const Topology& topology() const { return topo_; }
  // A peer has died (Note [Liveness]): MPI_Finalize would wait for it forever, and freeing the
  // communicators could too. Nothing is freed, and MPI is not finalized at exit by scaleout.
  void Abandon();

 private:
  MpiContext() = default;
  so_mpi_handle control_ = 0;
  std::vector<so_mpi_handle> data_;
  so_mpi_handle local_ = 0;
  so_mpi_handle admin_ = 0;
  so_mpi_handle cross_ = 0;
  so_mpi_handle local_data_ = 0;
  std::vector<so_mpi_handle> cross_data_;
  Topology topo_;
  bool abandoned_ = false;
};

}  // namespace scaleout

#endif  // SCALEOUT_TRANSPORT_MPI_MPI_CONTEXT_H_
