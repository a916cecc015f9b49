#include "collectives/fast_lane.h"

#include <sched.h>

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SO_LANE_RELAX() _mm_pause()
#else
#define SO_LANE_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace scaleout {
namespace {

// A lane attempt's waits: spin, then yield, until kGiveUpSeconds after the attempt began
// (Note [Fast lane]).
class Wait {
 public:
  explicit Wait(double spin_seconds)
      : spin_seconds_(spin_seconds), start_(std::chrono::steady_clock::now()) {}
  // One more turn of the wait; false once it has lasted kGiveUpSeconds.
  bool Next() {
    if (++turns_ % 16 == 0) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      if (waited >= FastLane::kGiveUpSeconds) return false;
      if (waited >= spin_seconds_) ::sched_yield();
    }
    SO_LANE_RELAX();
    return true;
  }

 private:
  double spin_seconds_;
  int turns_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

FastLane::FastLane(PeerMemory* memory)
    : rank_(memory->rank()), size_(memory->size()), round_(memory->LaneRound()) {
  for (int r = 0; r < size_; ++r) words_.push_back(memory->LaneWords(r));
}

bool FastLane::AllSaw(uint64_t round) const {
  for (int r = 0; r < size_; ++r) {
    if (W(r, kPosted).load(std::memory_order_acquire) == round + 1 &&
        W(r, kSeen).load(std::memory_order_acquire) != round + 1)
      return false;
  }
  return true;
}

void FastLane::Read(uint64_t round, const LanePost& post, bool* all, bool* same) const {
  *all = true;
  *same = true;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    // A rank's words are written before its round number (release) and not again before this
    // rank has seen the round decided: read after it (acquire), they are that round's.
    if (W(r, kPosted).load(std::memory_order_acquire) != round + 1) {
      *all = false;
    } else if (W(r, kKey).load(std::memory_order_relaxed) != post.key ||
               W(r, kCount).load(std::memory_order_relaxed) != post.count ||
               W(r, kShape).load(std::memory_order_relaxed) != post.shape) {
      *same = false;
    }
  }
}

bool FastLane::AnyAway() const {
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && W(r, kAway).load(std::memory_order_acquire) != 0) return true;
  }
  return false;
}

void FastLane::SetAway(bool away) {
  if (away != away_) {
    away_ = away;
    W(rank_, kAway).store(away ? 1 : 0, std::memory_order_release);
  }
  if (away) CallOff();
}

bool FastLane::Agree(const LanePost& post) {
  if (AnyAway()) return false;
  Wait wait(spin_seconds_);
  // Join the open round, or open the next once every rank in the last has seen its decision.
  uint64_t round = 0;
  for (;;) {
    uint64_t word = round_->load(std::memory_order_acquire);
    if (State(word) == kOpen) {
      round = Round(word);
      break;
    }
    if (AllSaw(Round(word)) && round_->compare_exchange_strong(word, Make(Round(word) + 1, kOpen),
                                                               std::memory_order_acq_rel)) {
      round = Round(word) + 1;
      break;
    }
    if (AnyAway() || !wait.Next()) return false;
  }
  W(rank_, kKey).store(post.key, std::memory_order_relaxed);
  W(rank_, kCount).store(post.count, std::memory_order_relaxed);
  W(rank_, kShape).store(post.shape, std::memory_order_relaxed);
  W(rank_, kPosted).store(round + 1, std::memory_order_release);  // with the area written before
  bool agreed = false;
  for (;;) {
    uint64_t word = round_->load(std::memory_order_acquire);
    if (Round(word) != round || State(word) != kOpen) {
      // Decided (or, for a rank that joined after the decision, decided and the next opened:
      // a round with a late post in it cannot have been agreed).
      agreed = Round(word) == round && State(word) == kAgreed;
      break;
    }
    bool all = false, same = false;
    Read(round, post, &all, &same);
    uint64_t decided = kOpen;
    if (!same) {
      decided = kCalledOff;
    } else if (all) {
      decided = kAgreed;
    } else if (AnyAway() || !wait.Next()) {
      decided = kCalledOff;
    }
    if (decided != kOpen)
      round_->compare_exchange_strong(word, Make(round, decided), std::memory_order_acq_rel);
  }
  W(rank_, kSeen).store(round + 1, std::memory_order_release);
  return agreed;
}

void FastLane::CallOff() {
  uint64_t word = round_->load(std::memory_order_acquire);
  if (State(word) != kOpen) return;
  if (W(rank_, kPosted).load(std::memory_order_relaxed) == Round(word) + 1) return;  // in it
  round_->compare_exchange_strong(word, Make(Round(word), kCalledOff), std::memory_order_acq_rel);
}

}  // namespace scaleout
