// Note [Fast lane]
// ~~~~~~~~~~~~~~~~
// A small synchronous allreduce that every rank of a one-machine set has negotiated before
// (its name has a response-cache slot) is the common case of a training loop's loss and metric
// reductions, and its cost was mostly agreement: a request to rank 0, a response back, then the
// one Sync of the data (Note [One-Sync allreduce]). On the fast lane a rank whose coordinator
// has nothing else to do writes its data into its area and posts what it wrote (the slot, the
// dtype, the op, the shape) beside it; when every rank has posted the same, each reduces the
// areas at once, with no message at all. Agreement without a leader needs a decision that every
// rank sees alike, so the lane runs in rounds decided by one shared word, (round, state), which
// only a compare-and-swap from "open" changes:
// - A rank joins the open round, or opens the next one once the last is decided and every rank
//   that posted in it has seen the decision (its acknowledgement), so no rank misses one.
// - It posts (its words, then the round number with release), then reads the others' posts: all
//   posted the same -> "agreed"; someone posted something else -> "called off".
// - A rank with work in negotiation (or one that cannot take the lane now: a timeline or
//   autotuning under way, the lane turned off) says so in a word of its own (SetAway), which a
//   waiting rank reads, and calls off an open round it is not in; a waiting rank calls its round
//   off after kGiveUpSeconds too: so nobody waits on the lane for a rank that went the other
//   way, even one whose coordinator sleeps, and a lane wait stays short (the deadlock, stall and
//   liveness machinery watch negotiation, not the lane).
// On "agreed" the areas are published to every rank as a Sync would publish them, and the
// allreduce finishes as a one-Sync allreduce does, with the same bits; the round takes the
// parity it wrote (PeerMemory::NextParity), so every rank's rounds stay in step. On "called off"
// nothing was taken (the area's contents are dead) and the collective goes to negotiation as it
// would have without the lane. A rank that joined a round only after it was decided sees it
// called off (an agreed round had every rank's post in it before its decision). Writing the
// area before anything is agreed is safe: an idle rank has finished its last round, which every
// other rank entered, so none still reads the areas of the parity before it (PeerMemory's
// contract); for the same reason a rank goes back on the lane (SetAway(false)) as soon as its
// last pending collective starts, before its data moves: the others, done with it, may post
// the next one meanwhile, into the other parity's areas. The lane is
// only for what a one-Sync allreduce runs (one machine, small, not halves, no scaling but
// Average's) and only when the coordinator is idle: nothing pending, joined or held, no
// timeline or autotuning under way. SCALEOUT_FAST_LANE=0 turns it off. A synchronous allreduce
// of the global set is offered to the lane before it is even enqueued (so_allreduce_now,
// Runtime::AllreduceNow, Coordinator::LaneNow): with nothing queued, the caller's thread runs
// it at once under the coordinator's step lock, with no entry in the handle table (only its
// name, reserved for the call) or the queue and no handle to wait on; if the lane does not
// take it, it is enqueued as usual (and its wait may try the lane again).
#ifndef SCALEOUT_COLLECTIVES_FAST_LANE_H_
#define SCALEOUT_COLLECTIVES_FAST_LANE_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "transport/peer_memory.h"

namespace scaleout {

// What a rank posts: every rank must post the same for a round to be agreed.
struct LanePost {
  uint64_t key = 0;    // the response-cache slot, dtype, op and rank of the shape
  uint64_t count = 0;  // elements
  uint64_t shape = 0;  // a hash of the shape
};

class FastLane {
 public:
  // `memory` has lane words (LaneRound() != nullptr); used by one thread at a time.
  explicit FastLane(PeerMemory* memory);

  // Called once this rank has written its part of a collective into its area of parity
  // memory->PeekParity(). True: every rank posted `post` in one round, and their areas are
  // visible to this rank; false: nothing was agreed (called off, not the same, or not every
  // rank in time), and the collective must be negotiated.
  bool Agree(const LanePost& post);
  // Whether this rank stays off the lane for now (work in negotiation, ...): while it does, no
  // round can be agreed, and an open one that it is not in is called off.
  void SetAway(bool away);
  // Whether waits spin before they yield (not where ranks outnumber cores).
  void SpinFirst(bool spin) { spin_seconds_ = spin ? kSpinSeconds : 0; }

  // A waiting rank calls its round off after this long (and gives up opening one).
  static constexpr double kGiveUpSeconds = 100e-6;

 private:
  enum : uint64_t { kOpen = 0, kAgreed = 1, kCalledOff = 2 };
  enum Word { kPosted = 0, kKey = 1, kCount = 2, kShape = 3, kSeen = 4, kAway = 5 };  // per rank
  static uint64_t Round(uint64_t word) { return word >> 2; }
  static uint64_t State(uint64_t word) { return word & 3; }
  static uint64_t Make(uint64_t round, uint64_t state) { return round << 2 | state; }

  // Every rank that posted in `round` has seen its decision.
  bool AllSaw(uint64_t round) const;
  // Another rank is off the lane (SetAway).
  bool AnyAway() const;
  void CallOff();
  // The posts of `round` so far: *all* every rank's, *same* all equal to `post`.
  void Read(uint64_t round, const LanePost& post, bool* all, bool* same) const;
  std::atomic<uint64_t>& W(int rank, Word w) const { return words_[rank][w]; }

  static constexpr double kSpinSeconds = 20e-6;
  int rank_;
  int size_;
  std::atomic<uint64_t>* round_;
  std::vector<std::atomic<uint64_t>*> words_;
  double spin_seconds_ = kSpinSeconds;
  bool away_ = false;  // what this rank's kAway word says
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_FAST_LANE_H_
