// The MPI side of a runtime: communicators duplicated from the user's one (so scaleout's
// traffic never mixes with the user's), and the rank layout across and within nodes.
#ifndef SCALEOUT_TRANSPORT_MPI_MPI_CONTEXT_H_
#define SCALEOUT_TRANSPORT_MPI_MPI_CONTEXT_H_

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

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
  // Runs on the communicator with that Fortran handle, or MPI_COMM_WORLD when !has_comm.
  // Initialises MPI when nobody has.
  // `data_channels` communicators are made for the data plane (one per endpoint server). Every
  // rank must ask for the same number, and give the same value for each of `agreed` (settings
  // named by their variable): checked here, an error naming the variable on every rank otherwise.
  static Status Create(bool has_comm, int64_t comm_fortran_handle, int data_channels,
                       const std::vector<std::pair<std::string, int64_t>>& agreed,
                       std::unique_ptr<MpiContext>* out);
  ~MpiContext();

  MPI_Comm control_comm() const { return control_; }
  MPI_Comm local_comm() const { return local_; }  // the ranks of this machine
  // For collectives on user threads (making process sets), never the coordinator's.
  MPI_Comm admin_comm() const { return admin_; }
  MPI_Comm data_comm(int i = 0) const { return data_[i]; }
  // Data communicators of this machine's ranks, and of the ranks with this local rank on every
  // machine (one per data channel: Note [Hierarchical allreduce], Note [Endpoint servers]).
  // Made only when the communicator spans machines.
  MPI_Comm local_data_comm() const { return local_data_; }
  MPI_Comm cross_data_comm(int i = 0) const { return cross_data_[i]; }
  int data_channels() const { return static_cast<int>(data_.size()); }
  const Topology& topology() const { return topo_; }
  // A peer has died (Note [Liveness]): MPI_Finalize would wait for it forever, and freeing the
  // communicators could too. Nothing is freed, and MPI is not finalized at exit by scaleout.
  void Abandon();

 private:
  MpiContext() = default;
  MPI_Comm control_ = MPI_COMM_NULL;
  std::vector<MPI_Comm> data_;
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm admin_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
  MPI_Comm local_data_ = MPI_COMM_NULL;
  std::vector<MPI_Comm> cross_data_;
  Topology topo_;
  bool abandoned_ = false;
};

// "MPI_Allreduce failed: <MPI's error string>"
Status MpiError(const char* what, int code);

}  // namespace scaleout

#endif  // SCALEOUT_TRANSPORT_MPI_MPI_CONTEXT_H_
