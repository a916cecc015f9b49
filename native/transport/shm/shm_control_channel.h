// Note [Shared-memory control channel]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// When every rank of a process set shares one machine, its coordinators talk through rings in
// the set's shared-memory segment instead of MPI messages: negotiation is a request and a
// response per collective, and a small collective's time was mostly theirs (an MPI message
// costs an Isend, an Iprobe on any source and a Recv, each a pass of MPI's progress engine; a
// ring costs a copy and two cache lines). Negotiation is a star, so there is one ring from each
// other rank to rank 0 and one back, each with one writer and one reader.
//
// Send never waits: a message that does not fit in the ring's free space goes through the MPI
// channel instead (a blocking send could wait for a rank that waits, in a collective, for this
// one). Order is kept across the two paths: every message carries its number in its sender's
// sequence to that receiver, the sender counts in the ring's header the messages it sent through
// MPI (after the MPI send, before any later ring write), and the receiver takes message n from
// the ring when the ring's next one is n, else from MPI once the count says one was sent.
//
// Threading: the coordinator of one rank (one thread at a time), as every ControlChannel.
#ifndef SCALEOUT_TRANSPORT_SHM_SHM_CONTROL_CHANNEL_H_
#define SCALEOUT_TRANSPORT_SHM_SHM_CONTROL_CHANNEL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "transport/control_channel.h"

namespace scaleout {

class ShmControlChannel : public ControlChannel {
 public:
  // Bytes of one ring, header included (a multiple of 64).
  static size_t RingBytes();
  // The memory of the ring between rank 0 and rank `peer` (1 .. size - 1) in one direction,
  // RingBytes() long, 64-byte aligned, zeroed before any rank used it, and the same memory on
  // every rank.
  using RingMemory = std::function<uint8_t*(int peer, bool toward_zero)>;
  // `overflow`: a channel over the same ranks for what does not fit (the set's MPI channel).
  ShmControlChannel(int rank, int size, const RingMemory& rings,
                    std::unique_ptr<ControlChannel> overflow);
  ~ShmControlChannel() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Between rank 0 and another rank only (negotiation's star).
  Status Send(int dest, std::vector<uint8_t> bytes) override;
  Status TryReceive(bool* got, int* src, std::vector<uint8_t>* bytes) override;
  Status TryReceiveFrom(int src, bool* got, std::vector<uint8_t>* bytes) override;
  void Abandon() override { overflow_->Abandon(); }

 private:
  struct Ring;
  struct Inbound {
    Ring* ring = nullptr;
    uint32_t next = 0;           // the number of the next message to deliver
    uint64_t overflow_seen = 0;  // messages taken from the overflow channel
  };
  struct Outbound {
    Ring* ring = nullptr;
    uint32_t next = 0;  // the number of the next message to send
  };
  Inbound* In(int src);
  Outbound* Out(int dest);

  int rank_;
  int size_;
  std::unique_ptr<ControlChannel> overflow_;
  std::vector<Inbound> in_;          // by source rank (rank 0: every other rank; others: rank 0)
  std::vector<Outbound> out_;        // by destination rank
  int next_source_ = 0;              // TryReceive's round-robin start
  bool overflow_in_flight_ = false;  // sends through overflow_ not known to be complete
};

}  // namespace scaleout

#endif  // SCALEOUT_TRANSPORT_SHM_SHM_CONTROL_CHANNEL_H_
