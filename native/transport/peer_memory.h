// Staging memory that every rank of the job can read: the data plane of ranks that share a
// machine. A rank writes its part of a collective into its own staging area, Sync()s, and then
// reads the other ranks' areas directly, so the write into the area is the whole transfer.
// Algorithms in collectives/ use this interface and never name shared memory (or MPI) itself.
//
// Contract: every rank calls Sync() the same number of times, in the same order as its
// collectives (the coordinator guarantees the order). Called from the coordinator thread only.
// A rank may write its own area of one parity while other ranks still read its area of the
// other parity; Area(rank, parity) stays valid for the object's lifetime.
#ifndef SCALEOUT_TRANSPORT_PEER_MEMORY_H_
#define SCALEOUT_TRANSPORT_PEER_MEMORY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace scaleout {

class PeerMemory {
 public:
  virtual ~PeerMemory() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Bytes in each area (a multiple of 64; each area starts on a 64-byte boundary).
  virtual size_t area_bytes() const = 0;
  // Rank `rank`'s area of parity 0 or 1.
  virtual uint8_t* Area(int rank, int parity) const = 0;
  // Returns once every rank has called Sync() as many times as this rank has: what each wrote
  // before is then visible to all. Fails (on this rank) when another rank has died meanwhile.
  virtual Status Sync() = 0;

  // The parity of the areas the next round of any algorithm writes: rounds alternate, whichever
  // algorithm runs them, so an algorithm may rely on the one before having left the other
  // parity's areas free once every rank has passed its next Sync.
  int NextParity() { return static_cast<int>(rounds_++ & 1); }
  // The parity NextParity() would return, not taken (Note [Fast lane]).
  int PeekParity() const { return static_cast<int>(rounds_ & 1); }

  // Note [Fast lane] (collectives/fast_lane.h): the lane's round word and rank `rank`'s
  // kLaneWords words, zero at first and the same memory on every rank; nullptr where this
  // memory has no lane.
  static constexpr int kLaneWords = 6;
  virtual std::atomic<uint64_t>* LaneRound() const { return nullptr; }
  virtual std::atomic<uint64_t>* LaneWords(int rank) const { return nullptr; }

 private:
  uint64_t rounds_ = 0;
};

}  // namespace scaleout

#endif  // SCALEOUT_TRANSPORT_PEER_MEMORY_H_
