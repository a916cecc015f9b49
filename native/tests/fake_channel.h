// An in-memory ControlChannel for unit tests: N simulated ranks in one process, one thread.
//
//   FakeNetwork net(3);
//   Controller c0(net.channel(0), config), c1(net.channel(1), config), c2(net.channel(2), config);
//
// Messages go into one FIFO queue per (source, destination) pair, so order between two ranks is
// kept as MPI's non-overtaking rule keeps it, while messages from different senders interleave.
// TryReceive takes from the senders round-robin, which is deterministic (a test that passes
// once passes every time) and fair (no sender is starved, as none is on a real network).
// The network counts what each rank sends, so tests can check that messages shrink.
//
// Not thread-safe: the tests drive every rank from one thread. The network owns the channels;
// it must outlive the Controllers that use them.
#ifndef SCALEOUT_TESTS_FAKE_CHANNEL_H_
#define SCALEOUT_TESTS_FAKE_CHANNEL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "transport/control_channel.h"

namespace scaleout {
namespace test {

class FakeNetwork {
 public:
  explicit FakeNetwork(int size)
      : size_(size),
        queues_(static_cast<size_t>(size) * static_cast<size_t>(size)),
        next_source_(static_cast<size_t>(size), 0),
        bytes_sent_(static_cast<size_t>(size), 0),
        messages_sent_(static_cast<size_t>(size), 0) {
    for (int r = 0; r < size; ++r) channels_.push_back(std::make_unique<Channel>(this, r));
  }
  FakeNetwork(const FakeNetwork&) = delete;
  FakeNetwork& operator=(const FakeNetwork&) = delete;

  int size() const { return size_; }
  ControlChannel* channel(int rank) { return channels_.at(static_cast<size_t>(rank)).get(); }

  // Messages sent and not yet received, in all queues or in those to `dest`.
  size_t in_flight() const {
    size_t n = 0;
    for (const auto& q : queues_) n += q.size();
    return n;
  }
  size_t in_flight_to(int dest) const {
    size_t n = 0;
    for (int src = 0; src < size_; ++src) n += Queue(src, dest).size();
    return n;
  }

  // What `rank` has sent since the start (or since ResetCounters).
  uint64_t bytes_sent(int rank) const { return bytes_sent_.at(static_cast<size_t>(rank)); }
  uint64_t messages_sent(int rank) const { return messages_sent_.at(static_cast<size_t>(rank)); }
  uint64_t total_bytes_sent() const {
    uint64_t n = 0;
    for (uint64_t b : bytes_sent_) n += b;
    return n;
  }
  uint64_t total_messages_sent() const {
    uint64_t n = 0;
    for (uint64_t m : messages_sent_) n += m;
    return n;
  }
  void ResetCounters() {
    std::fill(bytes_sent_.begin(), bytes_sent_.end(), 0);
    std::fill(messages_sent_.begin(), messages_sent_.end(), 0);
  }

  // A failing link, to test how errors from the channel surface: sends from `rank` fail.
  void FailSendsFrom(int rank, bool fail) {
    if (fail_send_.empty()) fail_send_.assign(static_cast<size_t>(size_), false);
    fail_send_.at(static_cast<size_t>(rank)) = fail;
  }

 private:
  class Channel : public ControlChannel {
   public:
    Channel(FakeNetwork* network, int rank) : network_(network), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return network_->size_; }
    Status Send(int dest, std::vector<uint8_t> bytes) override {
      return network_->Send(rank_, dest, std::move(bytes));
    }
    Status TryReceive(bool* got, int* src, std::vector<uint8_t>* bytes) override {
      return network_->TryReceive(rank_, got, src, bytes);
    }
    Status TryReceiveFrom(int src, bool* got, std::vector<uint8_t>* bytes) override {
      auto& q = network_->Queue(src, rank_);
      *got = !q.empty();
      if (*got) {
        *bytes = std::move(q.front());
        q.pop_front();
      }
      return Status::OK();
    }

   private:
    FakeNetwork* network_;
    int rank_;
  };

  size_t Index(int src, int dest) const {
    return static_cast<size_t>(src) * static_cast<size_t>(size_) + static_cast<size_t>(dest);
  }
  std::deque<std::vector<uint8_t>>& Queue(int src, int dest) { return queues_[Index(src, dest)]; }
  const std::deque<std::vector<uint8_t>>& Queue(int src, int dest) const {
    return queues_[Index(src, dest)];
  }

  Status Send(int src, int dest, std::vector<uint8_t> bytes) {
    if (dest < 0 || dest >= size_ || dest == src) {
      return Status::Internal("fake channel: rank " + std::to_string(src) + " sent to rank " +
                              std::to_string(dest));
    }
    if (!fail_send_.empty() && fail_send_[static_cast<size_t>(src)]) {
      return Status::Transport("fake channel: link from rank " + std::to_string(src) + " is down");
    }
    bytes_sent_[static_cast<size_t>(src)] += bytes.size();
    ++messages_sent_[static_cast<size_t>(src)];
    Queue(src, dest).push_back(std::move(bytes));
    return Status::OK();
  }

  Status TryReceive(int dest, bool* got, int* src, std::vector<uint8_t>* bytes) {
    *got = false;
    int& next = next_source_[static_cast<size_t>(dest)];
    for (int i = 0; i < size_; ++i) {
      const int from = (next + i) % size_;
      auto& q = Queue(from, dest);
      if (q.empty()) continue;
      *bytes = std::move(q.front());
      q.pop_front();
      *src = from;
      *got = true;
      next = (from + 1) % size_;
      return Status::OK();
    }
    return Status::OK();
  }

  int size_;
  std::vector<std::deque<std::vector<uint8_t>>> queues_;  // [src * size + dest]
  std::vector<int> next_source_;                          // by receiver: whom to look at first
  std::vector<uint64_t> bytes_sent_;
  std::vector<uint64_t> messages_sent_;
  std::vector<bool> fail_send_;  // empty: no failures
  std::vector<std::unique_ptr<Channel>> channels_;
};

}  // namespace test
}  // namespace scaleout

#endif  // SCALEOUT_TESTS_FAKE_CHANNEL_H_
