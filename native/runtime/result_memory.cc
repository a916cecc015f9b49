#include "runtime/result_memory.h"

#include <deque>
#include <mutex>
#include <new>
#include <unordered_map>

namespace scaleout {
namespace result_memory {

// Note [Result memory]
// A result's memory is written once (by MPI or a copy out of the staging areas) and then read
// by the caller. Fresh memory costs a page fault per 4 KiB page on that first write, and blocks
// of 32 MiB and more always come fresh from the allocator (glibc maps and unmaps them each
// time). Measured at 4 ranks on 2 cores, an allgather of 8 MiB per rank (32 MiB results) took
// 53 ms a call, 10 ms with the memory reused; a training loop asks for the same sizes every
// step. So a freed block of kReusedFrom bytes or more is kept (up to kKeptBlocks blocks and
// kKeptBytes bytes, the oldest dropped first), and a request takes the smallest kept block that
// holds it without wasting more than half of it. The pool is never destroyed: results may be
// freed while the process exits, after static destructors ran.
namespace {

class Pool {
 public:
  void* Allocate(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = kept_.end();
      for (auto it = kept_.begin(); it != kept_.end(); ++it) {
        if (it->bytes >= bytes && it->bytes / 2 <= bytes &&
            (best == kept_.end() || it->bytes < best->bytes)) {
          best = it;
        }
      }
      if (best != kept_.end()) {
        Block b = *best;
        kept_.erase(best);
        kept_bytes_ -= b.bytes;
        capacity_[b.data] = b.bytes;
        return b.data;
      }
    }
    void* data = ::operator new(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    capacity_[data] = bytes;
    return data;
  }

  void Release(void* data) {
    std::deque<Block> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = capacity_.find(data);
      const size_t bytes = it->second;
      capacity_.erase(it);
      kept_.push_back(Block{data, bytes});
      kept_bytes_ += bytes;
      while (kept_.size() > kKeptBlocks || kept_bytes_ > kKeptBytes) {
        dropped.push_back(kept_.front());
        kept_bytes_ -= kept_.front().bytes;
        kept_.pop_front();
      }
    }
    for (const Block& b : dropped) ::operator delete(b.data);
  }

  void Trim() {
    std::deque<Block> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dropped.swap(kept_);
      kept_bytes_ = 0;
    }
    for (const Block& b : dropped) ::operator delete(b.data);
  }

  size_t Kept() {
    std::lock_guard<std::mutex> lock(mu_);
    return kept_bytes_;
  }

 private:
  struct Block {
    void* data;
    size_t bytes;
  };
  std::mutex mu_;
  std::deque<Block> kept_;  // oldest first
  size_t kept_bytes_ = 0;
  std::unordered_map<void*, size_t> capacity_;  // blocks in use: their real size
};

Pool& ThePool() {
  static Pool* pool = new Pool;  // never destroyed (see the Note)
  return *pool;
}

}  // namespace

void* Allocate(size_t bytes) {
  if (bytes < kReusedFrom) return ::operator new(bytes);
  return ThePool().Allocate(bytes);
}

void Release(void* block, size_t bytes) {
  if (bytes < kReusedFrom) return ::operator delete(block);
  ThePool().Release(block);
}

size_t Kept() { return ThePool().Kept(); }

void Trim() { ThePool().Trim(); }

}  // namespace result_memory
}  // namespace scaleout
