// An in-process PeerMemory whose "ranks" are threads, for unit tests of the algorithms that
// stage through PeerMemory (Note [Staged allreduce], Note [Staged alltoall]).
#ifndef SCALEOUT_TESTS_SHARED_AREAS_H_
#define SCALEOUT_TESTS_SHARED_AREAS_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/reduce_kernels.h"
#include "transport/data_transport.h"
#include "transport/peer_memory.h"

namespace scaleout {
namespace test {

// A barrier for `n` threads, reusable.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// The areas of `size` ranks in one process; Sync is a barrier across the threads that play the
// ranks, and fails on the call numbered `fail_at` (1-based, 0: never) on every rank.
class SharedAreas {
 public:
  SharedAreas(int size, size_t area_bytes, uint64_t fail_at = 0)
      : size_(size),
        area_bytes_(area_bytes),
        fail_at_(fail_at),
        memory_(static_cast<size_t>(size) * 2 * area_bytes + 64),
        lane_(new std::atomic<uint64_t>[1 + static_cast<size_t>(size) * kLaneWords]()) {}

  class View : public PeerMemory {
   public:
    View(SharedAreas* shared, int rank) : shared_(shared), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return shared_->size_; }
    size_t area_bytes() const override { return shared_->area_bytes_; }
    uint8_t* Area(int rank, int parity) const override { return shared_->Area(rank, parity); }
    std::atomic<uint64_t>* LaneRound() const override { return &shared_->lane_[0]; }
    std::atomic<uint64_t>* LaneWords(int rank) const override {
      return &shared_->lane_[1 + static_cast<size_t>(rank) * kLaneWords];
    }
    Status Sync() override {
      const uint64_t count = ++syncs_;
      shared_->Barrier();
      if (count == shared_->fail_at_)
        return Status::Transport("sync " + std::to_string(count) + " failed");
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
  void Barrier() { barrier_.Wait(); }

  const int size_;
  const size_t area_bytes_;
  const uint64_t fail_at_;
  std::vector<uint8_t> memory_;
  static constexpr int kLaneWords = PeerMemory::kLaneWords;
  std::unique_ptr<std::atomic<uint64_t>[]> lane_;  // Note [Fast lane]: the round, then each rank's
  ThreadBarrier barrier_{size_};
};

// The cross transports of one local rank on `machines` fake machines (threads): a barrier, and
// each member's buffer read by the others in between (what the staged algorithms use). Also
// any group of threads, each a "machine" here, e.g. every rank of a communicator.
class CrossGroup {
 public:
  explicit CrossGroup(int machines) : machines_(machines), posted_(machines) {}

  class Member : public DataTransport {
   public:
    Member(CrossGroup* group, int machine) : group_(group), machine_(machine) {}
    int rank() const override { return machine_; }
    int size() const override { return group_->machines_; }
    Status Allreduce(const void* in, void* out, size_t count, DataType dtype,
                     ReduceOp op) override {
      const size_t bytes = count * DataTypeSize(dtype);
      std::vector<uint8_t> acc(bytes);
      group_->Post(machine_, in);
      std::memcpy(acc.data(), group_->posted_[0], bytes);
      for (int m = 1; m < size(); ++m) ReduceInto(acc.data(), group_->posted_[m], count, dtype, op);
      group_->Barrier();  // everyone has read every input before any output is written
      std::memcpy(out, acc.data(), bytes);
      return Status::OK();
    }
    Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                         DataType dtype, ReduceOp op) override {
      const size_t esize = DataTypeSize(dtype);
      size_t at = 0;
      for (int m = 0; m < machine_; ++m) at += counts[m];
      group_->Post(machine_, in);
      const size_t bytes = counts[machine_] * esize;
      std::memcpy(out, static_cast<const uint8_t*>(group_->posted_[0]) + at * esize, bytes);
      for (int m = 1; m < size(); ++m) {
        ReduceInto(out, static_cast<const uint8_t*>(group_->posted_[m]) + at * esize,
                   counts[machine_], dtype, op);
      }
      group_->Barrier();
      return Status::OK();
    }
    Status Allgatherv(const void* in, size_t, void* out,
                      const std::vector<size_t>& recv_bytes) override {
      group_->Post(machine_, in);
      size_t at = 0;
      for (int m = 0; m < size(); ++m) {
        std::memcpy(static_cast<uint8_t*>(out) + at, group_->posted_[m], recv_bytes[m]);
        at += recv_bytes[m];
      }
      group_->Barrier();
      return Status::OK();
    }
    Status Broadcast(void* buf, size_t bytes, int root) override {
      group_->Post(machine_, buf);
      if (machine_ != root) std::memcpy(buf, group_->posted_[root], bytes);
      group_->Barrier();
      return Status::OK();
    }
    Status Sendrecv(const void* send, size_t bytes, int peer, void* recv) override {
      group_->Post(machine_, send);
      std::memcpy(recv, group_->posted_[peer], bytes);
      group_->Barrier();  // the peer has read this member's buffer before either goes on
      return Status::OK();
    }
    Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes,
                     const std::vector<size_t>& send_at, void* out,
                     const std::vector<size_t>& recv_bytes,
                     const std::vector<size_t>& recv_at) override {
      const Sends mine{static_cast<const uint8_t*>(in), &send_bytes, &send_at};
      group_->Post(machine_, &mine);
      Status s;
      for (int m = 0; m < size(); ++m) {
        const Sends* from = static_cast<const Sends*>(group_->posted_[m]);
        const size_t bytes = (*from->bytes)[machine_];
        if (bytes != recv_bytes[m]) {
          s = Status::Internal("member " + std::to_string(machine_) + " expects " +
                               std::to_string(recv_bytes[m]) + " bytes from " + std::to_string(m) +
                               ", which sends " + std::to_string(bytes));
          continue;
        }
        std::memcpy(static_cast<uint8_t*>(out) + recv_at[m], from->in + (*from->at)[machine_],
                    bytes);
        std::lock_guard<std::mutex> lock(group_->mu_);
        group_->moved_[static_cast<size_t>(m) * size() + machine_] += bytes;
      }
      group_->Barrier();
      return s;
    }

   private:
    struct Sends {
      const uint8_t* in;
      const std::vector<size_t>* bytes;
      const std::vector<size_t>* at;
    };
    CrossGroup* group_;
    int machine_;
  };

  // Bytes member `from` has sent member `to` through Alltoallv so far.
  size_t Moved(int from, int to) const {
    return moved_[static_cast<size_t>(from) * machines_ + to];
  }

 private:
  // Publishes this member's buffer and waits until every member has.
  void Post(int machine, const void* buffer) {
    posted_[machine] = buffer;
    Barrier();
  }
  void Barrier() { barrier_.Wait(); }

  const int machines_;
  std::vector<const void*> posted_;
  std::vector<size_t> moved_ = std::vector<size_t>(static_cast<size_t>(machines_) * machines_, 0);
  std::mutex mu_;  // moved_
  ThreadBarrier barrier_{machines_};
};

}  // namespace test
}  // namespace scaleout

#endif  // SCALEOUT_TESTS_SHARED_AREAS_H_
