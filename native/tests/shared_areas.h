// An in-process PeerMemory whose "ranks" are threads, for unit tests of the algorithms that
// stage through PeerMemory (Note [Staged allreduce], Note [Staged alltoall]).
#ifndef SCALEOUT_TESTS_SHARED_AREAS_H_
#define SCALEOUT_TESTS_SHARED_AREAS_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "transport/peer_memory.h"

namespace scaleout {
namespace test {

// The areas of `size` ranks in one process; Sync is a barrier across the threads that play the
// ranks, and fails on the call numbered `fail_at` (1-based, 0: never) on every rank.
class SharedAreas {
 public:
  SharedAreas(int size, size_t area_bytes, uint64_t fail_at = 0)
      : size_(size), area_bytes_(area_bytes), fail_at_(fail_at),
        memory_(static_cast<size_t>(size) * 2 * area_bytes + 64) {}

  class View : public PeerMemory {
   public:
    View(SharedAreas* shared, int rank) : shared_(shared), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return shared_->size_; }
    size_t area_bytes() const override { return shared_->area_bytes_; }
    uint8_t* Area(int rank, int parity) const override { return shared_->Area(rank, parity); }
    Status Sync() override {
      const uint64_t count = ++syncs_;
      shared_->Barrier();
      if (count == shared_->fail_at_) return Status::Transport("sync " + std::to_string(count) + " failed");
      return Status::OK();
    }

   private:
    SharedAreas* shared_;
    int rank_;
    uint64_t syncs_ = 0;
  };

 private:
  uint8_t* Area(int rank, int parity) {
    uint8_t* base = memory_.data() + (64 - reinterpret_cast<uintptr_t>(memory_.data()) % 64) % 64;
    return base + (static_cast<size_t>(rank) * 2 + parity) * area_bytes_;
  }
  void Barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }

  const int size_;
  const size_t area_bytes_;
  const uint64_t fail_at_;
  std::vector<uint8_t> memory_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace test
}  // namespace scaleout

#endif  // SCALEOUT_TESTS_SHARED_AREAS_H_
