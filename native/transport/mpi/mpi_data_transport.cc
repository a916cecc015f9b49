#include "transport/mpi/mpi_data_transport.h"

#include <algorithm>
#include <array>
#include <climits>
#include <string>

#include <sched.h>
#include <time.h>

#include "collectives/reduce_kernels.h"
#include "common/traffic.h"
#include "transport/mpi/mpi_api.h"

namespace scaleout {
namespace {

// The MPI type a dtype travels as; float16 and bfloat16 have none: they travel as 16-bit words
// combined by the shim's ops that call back into the core (Note [Halves on the wire]).
int MpiType(DataType t) {
  switch (t) {
    case DataType::kUInt8:
      return SO_MPI_UINT8;
    case DataType::kInt8:
      return SO_MPI_INT8;
    case DataType::kInt16:
      return SO_MPI_INT16;
    case DataType::kUInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return SO_MPI_UINT16;
    case DataType::kInt32:
      return SO_MPI_INT32;
    case DataType::kInt64:
      return SO_MPI_INT64;
    case DataType::kFloat32:
      return SO_MPI_FLOAT;
    case DataType::kFloat64:
      return SO_MPI_DOUBLE;
    case DataType::kBool:
      return SO_MPI_C_BOOL;
    default:
      return -1;
  }
}

int MpiOp(DataType t, ReduceOp op) {
  const int plain = op == ReduceOp::kMin       ? SO_MPI_MIN
                    : op == ReduceOp::kMax     ? SO_MPI_MAX
                    : op == ReduceOp::kProduct ? SO_MPI_PROD
                                               : SO_MPI_SUM;
  if (t == DataType::kFloat16) return SO_MPI_HALF_OP(SO_MPI_FLOAT16, plain);
  if (t == DataType::kBFloat16) return SO_MPI_HALF_OP(SO_MPI_BFLOAT16, plain);
  if (t == DataType::kBool) {
    return (op == ReduceOp::kProduct || op == ReduceOp::kMin) ? SO_MPI_LAND : SO_MPI_LOR;
  }
  return plain;
}

// MPI counts are int: large buffers travel in chunks of at most kMaxCount elements.
constexpr size_t kMaxCount = size_t(1) << 30;

// `kind`: what the values are ("a block": sizes of messages, "an offset": displacements).
Status FitsInt(const std::vector<size_t>& v, const char* what, std::vector<int>* out,
               const char* kind = "a block") {
  out->resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] > static_cast<size_t>(INT_MAX)) {
      return Status::InvalidArgument(std::string(what) + ": " + kind + " of " +
                                     std::to_string(v[i]) +
                                     " bytes is larger than MPI's 2 GiB limit for one message");
    }
    (*out)[i] = static_cast<int>(v[i]);
  }
  return Status::OK();
}

std::vector<int> Displacements(const std::vector<int>& counts) {
  std::vector<int> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

constexpr unsigned kPollsPerCheck = 256;

}  // namespace

MpiDataTransport::MpiDataTransport(so_mpi_handle comm, Interrupted interrupted, bool sleepy)
    : comm_(comm), interrupted_(std::move(interrupted)), sleepy_(sleepy) {
  Mpi().comm_rank(comm_, &rank_);
  Mpi().comm_size(comm_, &size_);
}

Status MpiDataTransport::Wait(so_mpi_handle* request, const char* what) {
  const traffic::Timed waiting(traffic::kWAIT_NS);
  const auto test = Mpi().test;
  for (unsigned polls = 1;; ++polls) {
    int done = 0;
    int rc = test(request, &done);
    if (rc != 0) return broken_ = MpiError(what, rc);
    if (done) return Status::OK();
    if (polls % kPollsPerCheck != 0) continue;
    if (interrupted_) {
      Status s = interrupted_();
      if (!s.ok()) {
        // The request stays with MPI: nothing can complete or free it now.
        return broken_ = s.Reworded(s.message() + " (this rank gave up waiting in " + what + ")");
      }
    }
    if (sleepy_) {
      const timespec pause{0, 1000};
      ::nanosleep(&pause, nullptr);
    } else {
      ::sched_yield();
    }
  }
}

Status MpiDataTransport::Allreduce(const void* in, void* out, size_t count, DataType dtype,
                                   ReduceOp op) {
  if (!broken_.ok()) return broken_;
  const int type = MpiType(dtype);
  SO_CHECK(type >= 0, "a dtype without an MPI type reached the MPI transport");
  const size_t esize = DataTypeSize(dtype);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(count - done, kMaxCount);
    const char* src = static_cast<const char*>(in) + done * esize;
    char* dst = static_cast<char*>(out) + done * esize;
    if (IsHalf(dtype) && n >= static_cast<size_t>(size_) && size_ > 1) {
      // MPICH allreduces with a user op by recursive doubling, every rank sending the whole
      // buffer at every step; a reduce-scatter then an allgather sends 2 (size - 1) / size of
      // it, as MPICH's own large allreduces do (and each element is reduced in one place).
      Status s = ReduceScatterAllgather(src, dst, n, dtype, op);
      if (!s.ok()) return s;
      done += n;
      continue;
    }
    // Note [In place on every rank]
    // Ranks may reach the same allreduce in different forms: a rank that has joined reduces a
    // zero-filled fusion buffer in place, another its tensor from input to output, and
    // allreduce_ and allreduce of the same name may meet. MPI allows mixing MPI_IN_PLACE with
    // separate buffers, but Open MPI 5.0's nonblocking allreduce does not (at 4 ranks and 200 KB
    // its schedules differ and a rank fails with MPI_ERR_TRUNCATE in an NBC subrequest): so
    // every rank reduces in place, copying its input to its output first. (The reduce-scatter
    // above never runs in place.)
    if (src != dst) CopyBytes(dst, src, n * esize);
    traffic::Add(traffic::kMPI_BYTES, static_cast<int64_t>(n * esize));
    so_mpi_handle request = 0;
    int rc = Mpi().iallreduce(nullptr, dst, static_cast<int>(n), type, MpiOp(dtype, op), comm_,
                              &request);
    if (rc != 0) return MpiError("MPI_Iallreduce", rc);
    Status s = Wait(&request, "MPI_Iallreduce");
    if (!s.ok()) return s;
    done += n;
  }
  return Status::OK();
}

Status MpiDataTransport::ReduceScatterAllgather(const void* in, void* out, size_t count,
                                                DataType dtype, ReduceOp op) {
  const size_t esize = DataTypeSize(dtype);
  const std::vector<size_t> counts = EvenSplit(count, size_);
  std::vector<size_t> bytes(size_);
  for (int k = 0; k < size_; ++k) bytes[k] = counts[k] * esize;
  part_.resize(bytes[rank_]);
  Status s = ReduceScatter(in, part_.data(), counts, dtype, op);
  if (!s.ok()) return s;
  return Allgatherv(part_.data(), part_.size(), out, bytes);
}

Status MpiDataTransport::Allgatherv(const void* in, size_t in_bytes, void* out,
                                    const std::vector<size_t>& recv_bytes) {
  if (!broken_.ok()) return broken_;
  std::vector<int> counts;
  Status s = FitsInt(recv_bytes, "allgather", &counts);
  if (!s.ok()) return s;
  std::vector<int> displs = Displacements(counts);
  so_mpi_handle request = 0;
  traffic::Add(traffic::kMPI_BYTES, static_cast<int64_t>(in_bytes));
  int rc = Mpi().iallgatherv(in, static_cast<int>(in_bytes), out, counts.data(), displs.data(),
                             comm_, &request);
  if (rc != 0) return MpiError("MPI_Iallgatherv", rc);
  return Wait(&request, "MPI_Iallgatherv");
}

Status MpiDataTransport::Broadcast(void* buf, size_t bytes, int root) {
  if (!broken_.ok()) return broken_;
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(bytes - done, kMaxCount);
    so_mpi_handle request = 0;
    if (rank_ == root) traffic::Add(traffic::kMPI_BYTES, static_cast<int64_t>(n));
    int rc =
        Mpi().ibcast(static_cast<char*>(buf) + done, static_cast<int>(n), root, comm_, &request);
    if (rc != 0) return MpiError("MPI_Ibcast", rc);
    Status s = Wait(&request, "MPI_Ibcast");
    if (!s.ok()) return s;
    done += n;
  }
  return Status::OK();
}

Status MpiDataTransport::Alltoallv(const void* in, const std::vector<size_t>& send_bytes,
                                   const std::vector<size_t>& send_at, void* out,
                                   const std::vector<size_t>& recv_bytes,
                                   const std::vector<size_t>& recv_at) {
  if (!broken_.ok()) return broken_;
  std::vector<int> scounts, rcounts, sdispls, rdispls;
  Status s = FitsInt(send_bytes, "alltoall", &scounts);
  if (s.ok()) s = FitsInt(recv_bytes, "alltoall", &rcounts);
  if (s.ok()) s = FitsInt(send_at, "alltoall", &sdispls, "an offset");
  if (s.ok()) s = FitsInt(recv_at, "alltoall", &rdispls, "an offset");
  if (!s.ok()) return s;
  so_mpi_handle request = 0;
  int64_t sent = 0;
  for (int k = 0; k < size_; ++k) sent += k == rank_ ? 0 : scounts[k];
  traffic::Add(traffic::kMPI_BYTES, sent);
  int rc = Mpi().ialltoallv(in, scounts.data(), sdispls.data(), out, rcounts.data(), rdispls.data(),
                            comm_, &request);
  if (rc != 0) return MpiError("MPI_Ialltoallv", rc);
  return Wait(&request, "MPI_Ialltoallv");
}

Status MpiDataTransport::Sendrecv(const void* send, size_t bytes, int peer, void* recv) {
  if (!broken_.ok()) return broken_;
  traffic::Add(traffic::kMPI_BYTES, static_cast<int64_t>(bytes));
  for (size_t done = 0; done < bytes;) {
    const int n = static_cast<int>(std::min(bytes - done, static_cast<size_t>(INT_MAX)));
    so_mpi_handle requests[2] = {0, 0};
    int rc = Mpi().irecv(static_cast<char*>(recv) + done, n, peer, 0, comm_, &requests[0]);
    if (rc != 0) return MpiError("MPI_Irecv", rc);
    rc = Mpi().isend(static_cast<const char*>(send) + done, n, peer, 0, comm_, &requests[1]);
    if (rc != 0) return MpiError("MPI_Isend", rc);
    for (so_mpi_handle& request : requests) {
      Status s = Wait(&request, "MPI_Isend/MPI_Irecv");
      if (!s.ok()) return s;
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Status MpiDataTransport::ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                       DataType dtype, ReduceOp op) {
  if (!broken_.ok()) return broken_;
  const int type = MpiType(dtype);
  SO_CHECK(type >= 0, "a dtype without an MPI type reached the MPI transport");
  std::vector<int> icounts;
  Status s = FitsInt(counts, "reducescatter", &icounts);
  if (!s.ok()) return s;
  so_mpi_handle request = 0;
  int64_t elements = 0;
  for (size_t c : counts) elements += static_cast<int64_t>(c);
  traffic::Add(traffic::kMPI_BYTES, elements * static_cast<int64_t>(DataTypeSize(dtype)));
  int rc = Mpi().ireduce_scatter(in, out, icounts.data(), type, MpiOp(dtype, op), comm_, &request);
  if (rc != 0) return MpiError("MPI_Ireduce_scatter", rc);
  return Wait(&request, "MPI_Ireduce_scatter");
}

}  // namespace scaleout
