// ControlChannel over point-to-point MPI messages on a communicator of its own.
#ifndef SCALEOUT_TRANSPORT_MPI_MPI_CONTROL_CHANNEL_H_
#define SCALEOUT_TRANSPORT_MPI_MPI_CONTROL_CHANNEL_H_

#include <deque>
#include <vector>

#include "mpi/so_mpi.h"
#include "transport/control_channel.h"

namespace scaleout {

class MpiControlChannel : public ControlChannel {
 public:
  explicit MpiControlChannel(so_mpi_handle comm);
  ~MpiControlChannel() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status Send(int dest, std::vector<uint8_t> bytes) override;
  Status TryReceive(bool* got, int* src, std::vector<uint8_t>* bytes) override;
  Status TryReceiveFrom(int src, bool* got, std::vector<uint8_t>* bytes) override;
  // A peer died: sends still in flight may never complete; the destructor leaves them to MPI
  // (and their bytes allocated) instead of waiting.
  void Abandon() override { abandoned_ = true; }
  Status Progress(bool* in_flight) override;

 private:
  struct Pending {
    so_mpi_handle request;
    std::vector<uint8_t> bytes;
  };
  Status ReapSends();
  // From `source` (-1: any).
  Status Receive(int source, bool* got, int* src, std::vector<uint8_t>* bytes);

  so_mpi_handle comm_;
  int rank_ = 0;
  int size_ = 1;
  bool abandoned_ = false;
  std::deque<Pending> sends_;  // in flight; the bytes must live until MPI is done with them
};

}  // namespace scaleout

#endif  // SCALEOUT_TRANSPORT_MPI_MPI_CONTROL_CHANNEL_H_
