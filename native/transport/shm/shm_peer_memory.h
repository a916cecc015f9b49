// PeerMemory in one POSIX shared-memory segment mapped by every rank of a single-machine job.
//
// Layout: a header page; one 128-byte line per rank (its pid and its Sync() count, alone on its
// line so that ranks spinning on one another do not share lines); then each rank's two areas;
// then, if asked, the control channel's rings.
// Rank 0 creates the segment under a random name, the others open it, and once every rank has
// it mapped the name is unlinked: from then on the memory goes away with the last process,
// however the job ends. (A job killed between the two leaves the name behind; the next job's
// rank 0 removes those whose creator is gone.) See Note [Shared-memory sync] in the .cc for how
// ranks wait for one another.
#ifndef SCALEOUT_TRANSPORT_SHM_SHM_PEER_MEMORY_H_
#define SCALEOUT_TRANSPORT_SHM_SHM_PEER_MEMORY_H_

#include <memory>
#include <string>

#include "transport/data_transport.h"
#include "transport/peer_memory.h"

namespace scaleout {

class ShmPeerMemory : public PeerMemory {
 public:
  // Collective over `bootstrap` (which carries the segment's name and the ranks' agreement):
  // every rank gets the segment, or every rank gets an error saying why not (then nothing is
  // left behind). All ranks of `bootstrap` must be on this machine.
  // With `ring_bytes`, the segment also holds two rings of that many bytes (zeroed) between rank
  // 0 and each other rank, for the control channel (Note [Shared-memory control channel]).
  static Status Create(DataTransport* bootstrap, size_t area_bytes,
                       std::unique_ptr<ShmPeerMemory>* out, size_t ring_bytes = 0);
  ~ShmPeerMemory() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t area_bytes() const override { return area_bytes_; }
  uint8_t* Area(int rank, int parity) const override;
  Status Sync() override;
  std::atomic<uint64_t>* LaneRound() const override;
  std::atomic<uint64_t>* LaneWords(int rank) const override;
  // Whether a wait spins before it yields (true, the default); not when ranks outnumber cores,
  // where a spinning rank holds the core the awaited rank needs (Note [Shared-memory sync]).
  void SpinFirst(bool spin) { spin_seconds_ = spin ? kSpinSeconds : 0; }
  // The ring from rank `peer` (1 .. size - 1) toward rank 0, or from rank 0 to it; nullptr when
  // the segment was made without rings.
  uint8_t* ControlRing(int peer, bool toward_zero) const;

 private:
  struct RankLine;
  ShmPeerMemory(int rank, int size, size_t area_bytes, size_t ring_bytes)
      : rank_(rank), size_(size), area_bytes_(area_bytes), ring_bytes_(ring_bytes) {}
  Status Map(int fd, size_t bytes);
  RankLine* Line(int rank) const;
  Status WaitFor(int peer, uint64_t count);
  bool PeerGone(int peer) const;

  int rank_;
  int size_;
  size_t area_bytes_;
  size_t ring_bytes_;
  uint8_t* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  uint64_t syncs_ = 0;
  static constexpr double kSpinSeconds = 20e-6;
  double spin_seconds_ = kSpinSeconds;
};

}  // namespace scaleout

#endif  // SCALEOUT_TRANSPORT_SHM_SHM_PEER_MEMORY_H_
