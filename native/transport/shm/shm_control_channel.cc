#include "transport/shm/shm_control_channel.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

namespace scaleout {
namespace {

constexpr size_t kCapacity = size_t(64) << 10;  // a power of two
// A message larger than this goes through the overflow channel even into an empty ring, so that
// one large message cannot hold the ring against the small ones that follow.
constexpr size_t kLargestRecord = kCapacity / 2;

// A record: its payload's length and number, then the payload, padded to 8 bytes, so that a
// header never wraps around the ring's end.
struct RecordHeader {
  uint32_t length;
  uint32_t number;
};
static_assert(sizeof(RecordHeader) == 8, "record headers are 8 bytes");

size_t RecordBytes(size_t length) { return (sizeof(RecordHeader) + length + 7) & ~size_t(7); }

}  // namespace

// Zeroed memory is an empty ring. head and overflowed are the writer's, tail the reader's, each
// side on its own cache line.
struct ShmControlChannel::Ring {
  alignas(64) std::atomic<uint64_t> head;  // bytes written, ever
  std::atomic<uint64_t> overflowed;        // messages sent through the overflow channel, ever
  alignas(64) std::atomic<uint64_t> tail;  // bytes read, ever
  alignas(64) uint8_t data[kCapacity];

  void CopyIn(uint64_t at, const void* from, size_t n) {
    const size_t pos = static_cast<size_t>(at % kCapacity);
    const size_t first = std::min(n, kCapacity - pos);
    std::memcpy(data + pos, from, first);
    std::memcpy(data, static_cast<const uint8_t*>(from) + first, n - first);
  }
  void CopyOut(uint64_t at, void* to, size_t n) const {
    const size_t pos = static_cast<size_t>(at % kCapacity);
    const size_t first = std::min(n, kCapacity - pos);
    std::memcpy(to, data + pos, first);
    std::memcpy(static_cast<uint8_t*>(to) + first, data, n - first);
  }
};

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the control rings need lock-free atomics in shared memory");

size_t ShmControlChannel::RingBytes() { return sizeof(Ring); }

ShmControlChannel::ShmControlChannel(int rank, int size, const RingMemory& rings,
                                     std::unique_ptr<ControlChannel> overflow)
    : rank_(rank),
      size_(size),
      overflow_(std::move(overflow)),
      in_(static_cast<size_t>(size)),
      out_(static_cast<size_t>(size)) {
  for (int peer = 1; peer < size; ++peer) {
    if (rank != 0 && peer != rank) continue;
    Ring* toward_zero = reinterpret_cast<Ring*>(rings(peer, true));
    Ring* from_zero = reinterpret_cast<Ring*>(rings(peer, false));
    if (rank == 0) {
      in_[static_cast<size_t>(peer)].ring = toward_zero;
      out_[static_cast<size_t>(peer)].ring = from_zero;
    } else {
      in_[0].ring = from_zero;
      out_[0].ring = toward_zero;
    }
  }
}

ShmControlChannel::~ShmControlChannel() = default;

ShmControlChannel::Inbound* ShmControlChannel::In(int src) {
  if (src < 0 || src >= size_ || in_[static_cast<size_t>(src)].ring == nullptr) return nullptr;
  return &in_[static_cast<size_t>(src)];
}

ShmControlChannel::Outbound* ShmControlChannel::Out(int dest) {
  if (dest < 0 || dest >= size_ || out_[static_cast<size_t>(dest)].ring == nullptr) return nullptr;
  return &out_[static_cast<size_t>(dest)];
}

Status ShmControlChannel::Send(int dest, std::vector<uint8_t> bytes) {
  Outbound* out = Out(dest);
  if (out == nullptr) {
    return Status::Internal("shared-memory control channel: rank " + std::to_string(rank_) +
                            " cannot send to rank " + std::to_string(dest) +
                            " (only rank 0 and each other rank talk)");
  }
  Ring* ring = out->ring;
  const uint32_t number = out->next++;
  const size_t record = RecordBytes(bytes.size());
  const uint64_t head = ring->head.load(std::memory_order_relaxed);
  const uint64_t used = head - ring->tail.load(std::memory_order_acquire);
  if (record <= kLargestRecord && record <= kCapacity - used) {
    const RecordHeader header{static_cast<uint32_t>(bytes.size()), number};
    ring->CopyIn(head, &header, sizeof header);
    ring->CopyIn(head + sizeof header, bytes.data(), bytes.size());
    ring->head.store(head + record, std::memory_order_release);
    return Status::OK();
  }
  // The overflow message carries its number first; counted once it is on its way, before any
  // later record is published (the release of that record's head publishes the count too).
  std::vector<uint8_t> numbered(sizeof number + bytes.size());
  std::memcpy(numbered.data(), &number, sizeof number);
  if (!bytes.empty()) std::memcpy(numbered.data() + sizeof number, bytes.data(), bytes.size());
  Status s = overflow_->Send(dest, std::move(numbered));
  if (!s.ok()) return s;
  overflow_in_flight_ = true;
  ring->overflowed.fetch_add(1, std::memory_order_release);
  return Status::OK();
}

Status ShmControlChannel::TryReceiveFrom(int src, bool* got, std::vector<uint8_t>* bytes) {
  *got = false;
  Inbound* in = In(src);
  if (in == nullptr) return Status::OK();
  Ring* ring = in->ring;
  // The count first: the sender counts an overflowed message after publishing every earlier ring
  // record, so a count that includes message n + 1 comes with a head that shows message n.
  const uint64_t overflowed = ring->overflowed.load(std::memory_order_acquire);
  const uint64_t tail = ring->tail.load(std::memory_order_relaxed);
  if (ring->head.load(std::memory_order_acquire) != tail) {
    RecordHeader header;
    ring->CopyOut(tail, &header, sizeof header);
    if (header.number == in->next) {
      bytes->resize(header.length);
      ring->CopyOut(tail + sizeof header, bytes->data(), header.length);
      ring->tail.store(tail + RecordBytes(header.length), std::memory_order_release);
      ++in->next;
      *got = true;
      return Status::OK();
    }
  }
  // The next message went through the overflow channel (the ring is empty, or holds later ones).
  if (overflowed == in->overflow_seen) return Status::OK();
  std::vector<uint8_t> numbered;
  Status s = overflow_->TryReceiveFrom(src, got, &numbered);
  if (!s.ok() || !*got) return s;
  uint32_t number = 0;
  if (numbered.size() < sizeof number ||
      (std::memcpy(&number, numbered.data(), sizeof number), number != in->next)) {
    *got = false;
    return Status::Internal("shared-memory control channel: message " + std::to_string(number) +
                            " from rank " + std::to_string(src) + " arrived where " +
                            std::to_string(in->next) + " was due");
  }
  bytes->assign(numbered.begin() + sizeof number, numbered.end());
  ++in->next;
  ++in->overflow_seen;
  return Status::OK();
}

Status ShmControlChannel::TryReceive(bool* got, int* src, std::vector<uint8_t>* bytes) {
  *got = false;
  if (overflow_in_flight_) {  // MPI moves a large send along only inside MPI calls
    Status s = overflow_->Progress(&overflow_in_flight_);
    if (!s.ok()) return s;
  }
  for (int i = 0; i < size_; ++i) {
    const int from = (next_source_ + i) % size_;
    if (In(from) == nullptr) continue;
    Status s = TryReceiveFrom(from, got, bytes);
    if (!s.ok()) return s;
    if (*got) {
      *src = from;
      next_source_ = (from + 1) % size_;
      return Status::OK();
    }
  }
  return Status::OK();
}

}  // namespace scaleout
