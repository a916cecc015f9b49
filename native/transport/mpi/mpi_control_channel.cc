#include "transport/mpi/mpi_control_channel.h"

#include "transport/mpi/mpi_api.h"

namespace scaleout {
namespace {
constexpr int kControlTag = 7001;
}

MpiControlChannel::MpiControlChannel(so_mpi_handle comm) : comm_(comm) {
  Mpi().comm_rank(comm_, &rank_);
  Mpi().comm_size(comm_, &size_);
}

MpiControlChannel::~MpiControlChannel() {
  // The shutdown protocol has matched every message, so these complete.
  if (abandoned_) {
    new std::deque<Pending>(std::move(sends_));  // MPI may still read the bytes: never freed
    return;
  }
  for (Pending& p : sends_) Mpi().wait(&p.request);
}

Status MpiControlChannel::ReapSends() {
  while (!sends_.empty()) {
    int done = 0;
    int rc = Mpi().test(&sends_.front().request, &done);
    if (rc != 0) return MpiError("MPI_Test (control message)", rc);
    if (!done) break;
    sends_.pop_front();
  }
  return Status::OK();
}

Status MpiControlChannel::Send(int dest, std::vector<uint8_t> bytes) {
  sends_.push_back(Pending{0, std::move(bytes)});
  Pending& p = sends_.back();
  int rc = Mpi().isend(p.bytes.data(), static_cast<int>(p.bytes.size()), dest, kControlTag, comm_,
                       &p.request);
  if (rc != 0) return MpiError("MPI_Isend (control message)", rc);
  return ReapSends();
}

Status MpiControlChannel::Progress(bool* in_flight) {
  Status s = ReapSends();
  *in_flight = !sends_.empty();
  return s;
}

Status MpiControlChannel::TryReceive(bool* got, int* src, std::vector<uint8_t>* bytes) {
  return Receive(-1, got, src, bytes);
}

Status MpiControlChannel::TryReceiveFrom(int src, bool* got, std::vector<uint8_t>* bytes) {
  int from = src;
  return Receive(src, got, &from, bytes);
}

Status MpiControlChannel::Receive(int source, bool* got, int* src, std::vector<uint8_t>* bytes) {
  Status s = ReapSends();
  if (!s.ok()) return s;
  int flag = 0, count = 0;
  int rc = Mpi().iprobe(source, kControlTag, comm_, &flag, src, &count);
  if (rc != 0) return MpiError("MPI_Iprobe (control message)", rc);
  *got = flag != 0;
  if (!flag) return Status::OK();
  bytes->resize(count);
  rc = Mpi().recv(bytes->data(), count, *src, kControlTag, comm_);
  if (rc != 0) return MpiError("MPI_Recv (control message)", rc);
  return Status::OK();
}

}  // namespace scaleout
