// The data plane: moves (and, where the backend offers it, reduces) the bytes of collectives.
// Algorithms in collectives/ call only this interface and never name MPI or shared memory.
//
// Contract: every rank calls the same operations in the same order (the coordinator guarantees
// it). Called from the coordinator thread only. Counts are elements of `dtype`; byte vectors are
// per rank. float16/bfloat16 are reduced pairwise in float32, each combine rounded once to the
// half type.
#ifndef SCALEOUT_TRANSPORT_DATA_TRANSPORT_H_
#define SCALEOUT_TRANSPORT_DATA_TRANSPORT_H_

#include <cstddef>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace scaleout {

// `count` split into `parts` blocks as evenly as they go, the first count % parts one larger:
// the blocks of a ReduceScatter (block k to rank k).
inline std::vector<size_t> EvenSplit(size_t count, int parts) {
  std::vector<size_t> blocks(parts);
  for (int k = 0; k < parts; ++k) {
    blocks[k] = count / parts + (static_cast<size_t>(k) < count % parts ? 1 : 0);
  }
  return blocks;
}

class DataTransport {
 public:
  virtual ~DataTransport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // out = reduce(in over ranks); in == out reduces in place. Average is not accepted (Sum).
  virtual Status Allreduce(const void* in, void* out, size_t count, DataType dtype,
                           ReduceOp op) = 0;
  // Rank r's block (recv_bytes[r] bytes) lands at displacement sum(recv_bytes[0..r)) of out.
  virtual Status Allgatherv(const void* in, size_t in_bytes, void* out,
                            const std::vector<size_t>& recv_bytes) = 0;
  virtual Status Broadcast(void* buf, size_t bytes, int root) = 0;
  // Sends the send_bytes[r] bytes at in + send_at[r] to rank r; rank r's recv_bytes[r] bytes
  // land at out + recv_at[r]. Pairs with no bytes exchange nothing.
  virtual Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes,
                           const std::vector<size_t>& send_at, void* out,
                           const std::vector<size_t>& recv_bytes,
                           const std::vector<size_t>& recv_at) = 0;
  // Sends `bytes` bytes to rank `peer` and receives as many from it into `recv` (a pairwise
  // exchange: the peer calls it with this rank).
  virtual Status Sendrecv(const void* send, size_t bytes, int peer, void* recv) = 0;
  // Reduces `in` (sum(counts) elements) over ranks; rank r receives block r (counts[r]) in out.
  virtual Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                               DataType dtype, ReduceOp op) = 0;
};

}  // namespace scaleout

#endif  // SCALEOUT_TRANSPORT_DATA_TRANSPORT_H_
