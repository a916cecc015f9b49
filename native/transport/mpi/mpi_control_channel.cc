#include "transport/mpi/mpi_control_channel.h"

#include "transport/mpi/mpi_context.h"

namespace scaleout {
namespace {
constexpr int kControlTag = 7001;
}

MpiControlChannel::MpiControlChannel(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiControlChannel::~MpiControlChannel() {
  // The shutdown protocol has matched every message, so these complete.
  if (abandoned_) {
    new std::deque<Pending>(std::move(sends_));  // MPI may still read the bytes: never freed
    return;
  }
  for (Pending& p : sends_) MPI_Wait(&p.request, MPI_STATUS_IGNORE);
}

Status MpiControlChannel::ReapSends() {
  while (!sends_.empty()) {
    int done = 0;
    int rc = MPI_Test(&sends_.front().request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Test (control message)", rc);
    if (!done) break;
    sends_.pop_front();
  }
  return Status::OK();
}

Status MpiControlChannel::Send(int dest, std::vector<uint8_t> bytes) {
  sends_.push_back(Pending{MPI_REQUEST_NULL, std::move(bytes)});
  Pending& p = sends_.back();
  int rc = MPI_Isend(p.bytes.data(), static_cast<int>(p.bytes.size()), MPI_BYTE, dest, kControlTag,
                     comm_, &p.request);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Isend (control message)", rc);
  return ReapSends();
}

Status MpiControlChannel::TryReceive(bool* got, int* src, std::vector<uint8_t>* bytes) {
  Status s = ReapSends();
  if (!s.ok()) return s;
  int flag = 0;
  MPI_Status status;
  int rc = MPI_Iprobe(MPI_ANY_SOURCE, kControlTag, comm_, &flag, &status);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Iprobe (control message)", rc);
  *got = flag != 0;
  if (!flag) return Status::OK();
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  bytes->resize(count);
  *src = status.MPI_SOURCE;
  rc = MPI_Recv(bytes->data(), count, MPI_BYTE, status.MPI_SOURCE, kControlTag, comm_,
                MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Recv (control message)", rc);
  return Status::OK();
}

}  // namespace scaleout
