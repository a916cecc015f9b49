// Alltoall through PeerMemory (ranks that share a machine): each rank writes, into its own
// staging area, how many bytes it sends to every rank of the machine and the first part of
// them; after one Sync every rank copies what is addressed to it straight out of the senders'
// areas. Across machines, the pairs on different machines exchange over MPI. See Note [Staged
// alltoall].
//
// Threading: coordinator thread only (it drives PeerMemory::Sync).
#ifndef SCALEOUT_COLLECTIVES_STAGED_ALLTOALL_H_
#define SCALEOUT_COLLECTIVES_STAGED_ALLTOALL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "transport/data_transport.h"
#include "transport/peer_memory.h"

namespace scaleout {

class StagedAlltoall {
 public:
  // Every rank on this machine: `memory` is over all of the communicator's ranks.
  explicit StagedAlltoall(PeerMemory* memory) : memory_(memory) {}
  // Ranks on several machines: `memory` is over this machine's ranks (in local rank order),
  // `all` over every rank of the communicator (this rank is all->rank()); per rank of it, its
  // machine and its local rank. Without `memory` (no shared memory), every pair goes over
  // `all` (the layout may then be empty).
  StagedAlltoall(PeerMemory* memory, DataTransport* all, std::vector<int> machine_of,
                 const std::vector<int>& local_rank_of);

  // Gives the result's memory once the rows received from every rank are known (received[k]
  // rows from rank k, in rank order); it must hold their sum times row_bytes.
  using AllocateFn = std::function<uint8_t*(const std::vector<int64_t>& received)>;

  // Sends rows [sum(send_rows[:k]), sum(send_rows[:k + 1])) of `input` (rows of row_bytes
  // each) to rank k and receives every rank's rows for this one, in rank order. Every rank
  // calls it with the same row_bytes; send_rows may differ (what rank j sends to k is what k
  // receives from j). Fills *received.
  Status Run(const uint8_t* input, const std::vector<int64_t>& send_rows, size_t row_bytes,
             const AllocateFn& allocate, std::vector<int64_t>* received);

  // Bytes of each destination's slot in an area of `area_bytes` shared by `size` ranks, after
  // the header of send counts: whole 64-byte lines (exposed for tests).
  static size_t SlotBytes(size_t area_bytes, int size);

 private:
  // The exchange among this machine's ranks (by local rank): send_rows[k] rows at
  // input + send_at[k] go to local rank k. After the first Sync, `place` is given the rows each
  // local rank sends this one and returns where they go (one pointer per local rank).
  using PlaceFn = std::function<std::vector<uint8_t*>(const std::vector<int64_t>& incoming)>;
  Status Exchange(const uint8_t* input, const std::vector<int64_t>& send_rows,
                  const std::vector<size_t>& send_at, size_t row_bytes, const PlaceFn& place);
  // Run with `all_`: counts over it, this machine's pairs through Exchange (with memory_), the
  // others over it.
  Status RunOver(const uint8_t* input, const std::vector<int64_t>& send_rows, size_t row_bytes,
                 const AllocateFn& allocate, std::vector<int64_t>* received);

  PeerMemory* memory_;            // null: no shared memory
  DataTransport* all_ = nullptr;  // null: every rank is on this machine, all in `memory_`
  std::vector<int> machine_of_;
  std::vector<int> machine_ranks_;  // this machine's ranks, by local rank
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_STAGED_ALLTOALL_H_
