#include "collectives/staged_alltoall.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/traffic.h"

namespace scaleout {

// Note [Staged alltoall]
// A rank's area is a header (the rows it sends to each rank, size int64s, padded to a 64-byte
// line) followed by one slot per destination rank, all of the same size. A round:
//   1. every rank writes the next slot-sized part of its bytes for rank k into slot k of its
//      own area (in round 0 also the header);                                         Sync
//   2. every rank copies the part addressed to it out of slot `rank` of each other rank's
//      area into its result.
// After the first Sync every rank has read every header, so all know every pair's byte count
// and agree on the number of rounds (the largest pair's bytes over the slot size, at least
// one). Its own rows a rank copies from input to result directly. Rounds alternate between the
// two areas of each rank (PeerMemory::NextParity, shared with the staged allreduce): a rank
// writes round n + 1 into its other area while slower ranks may still read round n, and it only
// comes back to an area after the Sync of round n + 1, which every rank reaches only once it
// has finished reading round n. So one Sync per round suffices; per byte, one copy into the
// sender's area and one out of it, against MPI's separate exchange of counts and its own two
// copies through shared memory with a handshake per message.
//
// Across machines (a communicator spanning machines whose ranks share memory with their
// machine's other ranks), every rank first learns the rows every rank sends it over MPI (one
// alltoall of counts), so it can allocate its result; then the pairs on this machine exchange
// as above, straight into their places in the result, and the pairs on different machines in
// one MPI alltoallv in which this machine's pairs send nothing. Only bytes between machines
// leave the machine, each once, as with a flat alltoall; the rest costs two copies without MPI's
// per-message handshakes.

StagedAlltoall::StagedAlltoall(PeerMemory* memory, DataTransport* all, std::vector<int> machine_of,
                               const std::vector<int>& local_rank_of)
    : memory_(memory), all_(all), machine_of_(std::move(machine_of)) {
  if (memory_ == nullptr) return;
  machine_ranks_.assign(memory_->size(), -1);
  const int machine = machine_of_[all_->rank()];
  for (size_t q = 0; q < machine_of_.size(); ++q) {
    if (machine_of_[q] == machine) machine_ranks_[local_rank_of[q]] = static_cast<int>(q);
  }
}

size_t StagedAlltoall::SlotBytes(size_t area_bytes, int size) {
  const size_t header = (static_cast<size_t>(size) * sizeof(int64_t) + 63) / 64 * 64;
  if (area_bytes <= header) return 0;
  return (area_bytes - header) / static_cast<size_t>(size) / 64 * 64;
}

Status StagedAlltoall::Exchange(const uint8_t* input, const std::vector<int64_t>& send_rows,
                                const std::vector<size_t>& send_at, size_t row_bytes,
                                const PlaceFn& place) {
  const int size = memory_->size();
  const int self = memory_->rank();
  const size_t header = (static_cast<size_t>(size) * sizeof(int64_t) + 63) / 64 * 64;
  const size_t slot = SlotBytes(memory_->area_bytes(), size);
  if (slot == 0) {
    return Status::InvalidArgument("the shared-memory staging area (" +
                                   std::to_string(memory_->area_bytes()) +
                                   " bytes, SCALEOUT_SHM_AREA) is too small for an alltoall "
                                   "among " +
                                   std::to_string(size) + " ranks");
  }
  std::vector<int64_t> incoming(size, 0);
  std::vector<uint8_t*> dest;
  size_t rounds = 1;
  for (size_t round = 0; round < rounds; ++round) {
    const int parity = memory_->NextParity();
    uint8_t* mine = memory_->Area(self, parity);
    if (round == 0) std::memcpy(mine, send_rows.data(), size * sizeof(int64_t));
    const size_t from = round * slot;
    for (int k = 0; k < size; ++k) {
      const size_t bytes = static_cast<size_t>(send_rows[k]) * row_bytes;
      if (k == self || from >= bytes) continue;
      std::memcpy(mine + header + k * slot, input + send_at[k] + from,
                  std::min(slot, bytes - from));
      traffic::Add(traffic::kSHM_BYTES, static_cast<int64_t>(std::min(slot, bytes - from)));
    }
    Status s = memory_->Sync();
    if (!s.ok()) return s;
    if (round == 0) {
      size_t largest = 0;
      for (int j = 0; j < size; ++j) {
        const int64_t* rows = reinterpret_cast<const int64_t*>(memory_->Area(j, parity));
        for (int k = 0; k < size; ++k) {
          if (j != k) largest = std::max(largest, static_cast<size_t>(rows[k]) * row_bytes);
        }
        incoming[j] = rows[self];
      }
      rounds = std::max<size_t>(1, (largest + slot - 1) / slot);
      dest = place(incoming);
      const size_t own = static_cast<size_t>(send_rows[self]) * row_bytes;
      if (own > 0) std::memcpy(dest[self], input + send_at[self], own);
    }
    for (int j = 0; j < size; ++j) {
      const size_t bytes = static_cast<size_t>(incoming[j]) * row_bytes;
      if (j == self || from >= bytes) continue;
      std::memcpy(dest[j] + from, memory_->Area(j, parity) + header + self * slot,
                  std::min(slot, bytes - from));
    }
  }
  return Status::OK();
}

namespace {

// Byte offsets of consecutive blocks of rows[k] * row_bytes bytes.
std::vector<size_t> Offsets(const std::vector<int64_t>& rows, size_t row_bytes) {
  std::vector<size_t> at(rows.size() + 1, 0);
  for (size_t k = 0; k < rows.size(); ++k)
    at[k + 1] = at[k] + static_cast<size_t>(rows[k]) * row_bytes;
  return at;
}

}  // namespace

Status StagedAlltoall::Run(const uint8_t* input, const std::vector<int64_t>& send_rows,
                           size_t row_bytes, const AllocateFn& allocate,
                           std::vector<int64_t>* received) {
  if (all_ != nullptr) return RunOver(input, send_rows, row_bytes, allocate, received);
  return Exchange(input, send_rows, Offsets(send_rows, row_bytes), row_bytes,
                  [&](const std::vector<int64_t>& incoming) {
                    *received = incoming;
                    uint8_t* result = allocate(incoming);
                    const std::vector<size_t> at = Offsets(incoming, row_bytes);
                    std::vector<uint8_t*> dest;
                    for (size_t j = 0; j < incoming.size(); ++j) dest.push_back(result + at[j]);
                    return dest;
                  });
}

Status StagedAlltoall::RunOver(const uint8_t* input, const std::vector<int64_t>& send_rows,
                               size_t row_bytes, const AllocateFn& allocate,
                               std::vector<int64_t>* received) {
  const int size = all_->size();
  const int machine = memory_ != nullptr ? machine_of_[all_->rank()] : -1;
  received->assign(size, 0);
  std::vector<size_t> eight(size, sizeof(int64_t)), eight_at(size);
  for (int k = 0; k < size; ++k) eight_at[k] = k * sizeof(int64_t);
  Status s = all_->Alltoallv(send_rows.data(), eight, eight_at, received->data(), eight, eight_at);
  if (!s.ok()) return s;
  uint8_t* result = allocate(*received);
  const std::vector<size_t> send_at = Offsets(send_rows, row_bytes);
  const std::vector<size_t> recv_at = Offsets(*received, row_bytes);
  if (memory_ != nullptr) {  // this machine's pairs, through the staging areas
    std::vector<int64_t> local_rows;
    std::vector<size_t> local_at;
    for (int q : machine_ranks_) {
      local_rows.push_back(send_rows[q]);
      local_at.push_back(send_at[q]);
    }
    s = Exchange(input, local_rows, local_at, row_bytes, [&](const std::vector<int64_t>&) {
      std::vector<uint8_t*> dest;
      for (int q : machine_ranks_) dest.push_back(result + recv_at[q]);
      return dest;
    });
    if (!s.ok()) return s;
  }
  // The others over `all_`, where this machine's pairs send nothing.
  std::vector<size_t> send_bytes(size), recv_bytes(size);
  for (int k = 0; k < size; ++k) {
    if (memory_ != nullptr && machine_of_[k] == machine) continue;
    send_bytes[k] = send_at[k + 1] - send_at[k];
    recv_bytes[k] = recv_at[k + 1] - recv_at[k];
  }
  return all_->Alltoallv(input, send_bytes, send_at, result, recv_bytes, recv_at);
}

}  // namespace scaleout
