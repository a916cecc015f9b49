#include "transport/shm/shm_peer_memory.h"

#include "common/process.h"
#include "common/traffic.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SO_CPU_RELAX() _mm_pause()
#else
#define SO_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace scaleout {

struct ShmPeerMemory::RankLine {
  std::atomic<uint64_t> syncs;    // how many times this rank has entered Sync()
  std::atomic<uint32_t> futex;    // the low 32 bits of syncs, for waiters to sleep on
  std::atomic<uint32_t> waiters;  // ranks asleep (or about to be) on `futex`
  int64_t pid;
  uint64_t pid_namespace;  // PidNamespace() of the rank
  uint8_t pad[64 - 4 * sizeof(uint64_t)];
  // Note [Fast lane]: on a line of their own (the waits above poll `syncs`).
  std::atomic<uint64_t> lane[PeerMemory::kLaneWords];
  uint8_t lane_pad[64 - PeerMemory::kLaneWords * sizeof(uint64_t)];
};

namespace {

static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t) &&
                  std::atomic<uint64_t>::is_always_lock_free &&
                  sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "Sync() needs lock-free atomics in shared memory");

// Process-shared futex calls (no FUTEX_PRIVATE_FLAG: the word is in a shared mapping).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, double seconds) {
  struct timespec timeout;
  timeout.tv_sec = static_cast<time_t>(seconds);
  timeout.tv_nsec = static_cast<long>((seconds - static_cast<double>(timeout.tv_sec)) * 1e9);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &timeout, nullptr,
            0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
            0);
}

constexpr uint64_t kMagic = 0x73636c6f7574534eULL;  // "scloutSN": the layout with lane words
constexpr size_t kPage = 4096;
constexpr size_t kNameBytes = 64;

struct Header {
  uint64_t magic;
  uint64_t size;
  uint64_t area_bytes;
  uint8_t pad[64 - 3 * sizeof(uint64_t)];
  std::atomic<uint64_t> lane_round;  // Note [Fast lane]: on a line of its own
};

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t LinesBytes(int size) { return RoundUp(static_cast<size_t>(size) * 128, kPage); }

// False when the segment would not fit in a size_t.
bool SegmentBytes(int size, size_t area_bytes, size_t ring_bytes, size_t* bytes) {
  size_t areas, with_areas;
  const size_t rings = static_cast<size_t>(size - 1) * 2 * ring_bytes;  // ring_bytes is small
  return !__builtin_mul_overflow(static_cast<size_t>(size) * 2, area_bytes, &areas) &&
         !__builtin_add_overflow(kPage + LinesBytes(size), areas, &with_areas) &&
         !__builtin_add_overflow(with_areas, rings, bytes);
}

// Segments are named /scaleout-<pid namespace>-<rank 0's pid>-<random> and unlinked as soon as
// every rank has mapped them; a job killed before that leaves one behind. Removes those of this
// user whose creator is gone. A pid means something only in its own pid namespace: containers
// that share /dev/shm (but not their pids) each see the others' creators as "no such process",
// and would unlink a segment another job is setting up. So only segments made in this pid
// namespace are judged (and those of older versions, named without one, are left alone).
void RemoveStaleSegments() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  const uid_t uid = ::geteuid();
  const uint64_t ours = PidNamespace();
  while (dirent* e = ::readdir(dir)) {
    const char* n = e->d_name;
    if (ours == 0 || std::strncmp(n, "scaleout-", 9) != 0) continue;
    char* end = nullptr;
    const unsigned long long space = std::strtoull(n + 9, &end, 10);
    if (end == n + 9 || *end != '-' || space != ours) continue;
    const char* at = end + 1;
    const long pid = std::strtol(at, &end, 10);
    if (end == at || *end != '-' || pid <= 0) continue;
    struct stat st;
    const std::string path = std::string("/dev/shm/") + n;
    if (::stat(path.c_str(), &st) != 0 || st.st_uid != uid) continue;
    if (ProcessGone(static_cast<pid_t>(pid))) ::shm_unlink((std::string("/") + n).c_str());
  }
  ::closedir(dir);
}

std::string NewName() {
  std::random_device device;
  std::ostringstream name;
  name << "/scaleout-" << PidNamespace() << "-" << ::getpid() << "-" << std::hex << device()
       << device();
  return name.str();
}

}  // namespace

// Note [Shared-memory sync]
// Sync() is a counting barrier: a rank stores its count of Sync() calls (release) into its own
// line and waits until every other rank's count has caught up (acquire), which also publishes
// every write made to the areas before. A waiting rank spins briefly (the others are usually
// microseconds behind), then yields the core for a while, then sleeps on a futex over the
// awaited rank's count, which that rank wakes when it arrives (it only makes the system call
// when someone sleeps). Sleeping matters with more ranks than cores, where a spinning rank takes
// the core from the rank it waits for; the futex, unlike a timed sleep, wakes it as soon as the
// rank arrives. The sleeper and the arriving rank each write their side (the waiter count, the
// count) before reading the other's, with sequentially consistent atomics, so at least one of
// them sees the other: no wake-up is lost. Every tenth of a second of waiting the rank checks
// that the rank it waits for is still alive, so a rank that died makes the others fail with an
// error that names it instead of waiting forever.
namespace {
constexpr double kYieldSeconds = 100e-6;
constexpr double kAliveCheckSeconds = 0.1;
}  // namespace

Status ShmPeerMemory::Create(DataTransport* bootstrap, size_t area_bytes,
                             std::unique_ptr<ShmPeerMemory>* out, size_t ring_bytes) {
  const int rank = bootstrap->rank();
  const int size = bootstrap->size();
  area_bytes = RoundUp(area_bytes, kPage);
  ring_bytes = RoundUp(ring_bytes, 64);
  size_t bytes = 0;
  std::unique_ptr<ShmPeerMemory> mem(new ShmPeerMemory(rank, size, area_bytes, ring_bytes));
  std::string error;
  char name[kNameBytes] = {0};
  if (!SegmentBytes(size, area_bytes, ring_bytes, &bytes)) {
    error = std::to_string(size) + " ranks' areas of " + std::to_string(area_bytes) +
            " bytes do not fit in memory";
  } else if (rank == 0) {
    RemoveStaleSegments();
    const std::string chosen = NewName();
    int fd = ::shm_open(chosen.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      error = SystemError("shm_open(" + chosen + ")", errno);
    } else {
      // posix_fallocate, unlike ftruncate alone, makes a too-small /dev/shm fail here rather
      // than with SIGBUS at the first touch of a page it cannot back.
      int rc = ::ftruncate(fd, static_cast<off_t>(bytes)) != 0
                   ? errno
                   : ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
      if (rc != 0) {
        error = SystemError("reserving " + std::to_string(bytes >> 20) + " MiB in " + chosen, rc);
      } else {
        Status s = mem->Map(fd, bytes);
        if (!s.ok()) error = s.message();
      }
      ::close(fd);
      if (!error.empty()) {
        ::shm_unlink(chosen.c_str());
      } else {
        auto* header = reinterpret_cast<Header*>(mem->base_);
        header->magic = kMagic;
        header->size = static_cast<uint64_t>(size);
        header->area_bytes = area_bytes;
        std::strncpy(name, chosen.c_str(), kNameBytes - 1);
      }
    }
  }
  Status s = bootstrap->Broadcast(name, kNameBytes, 0);
  if (!s.ok()) {
    if (rank == 0 && name[0] != '\0') ::shm_unlink(name);
    return s;
  }
  if (rank != 0 && error.empty()) {
    if (name[0] == '\0') {
      error = "rank 0 could not create the segment";
    } else {
      int fd = ::shm_open(name, O_RDWR, 0600);
      if (fd < 0) {
        error = SystemError(std::string("shm_open(") + name + ")", errno);
      } else {
        struct stat st;
        if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
          error = std::string(name) + " is not the size rank 0 made it";
        } else {
          Status m = mem->Map(fd, bytes);
          if (!m.ok()) error = m.message();
        }
        ::close(fd);
      }
      if (error.empty() && reinterpret_cast<Header*>(mem->base_)->magic != kMagic) {
        error = std::string(name) + " is not a scaleout segment";
      }
    }
  }
  if (error.empty()) {
    RankLine* line = mem->Line(rank);
    line->pid = ::getpid();
    line->pid_namespace = PidNamespace();
    line->futex.store(0);
    line->waiters.store(0);
    line->syncs.store(0, std::memory_order_release);
  }
  // Every rank must hold the segment before its name goes, and all must agree to use it.
  int32_t ok = error.empty() ? 1 : 0;
  s = bootstrap->Allreduce(&ok, &ok, 1, DataType::kInt32, ReduceOp::kMin);
  if (rank == 0 && name[0] != '\0') ::shm_unlink(name);
  if (!s.ok()) return s;
  if (!ok) {
    return Status::Transport(error.empty() ? "another rank could not map the shared-memory segment"
                                           : error);
  }
  *out = std::move(mem);
  return Status::OK();
}

Status ShmPeerMemory::Map(int fd, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return Status::Transport(SystemError("mmap of the shared-memory segment", errno));
  base_ = static_cast<uint8_t*>(p);
  mapped_bytes_ = bytes;
  return Status::OK();
}

ShmPeerMemory::~ShmPeerMemory() {
  if (base_ != nullptr) ::munmap(base_, mapped_bytes_);
}

ShmPeerMemory::RankLine* ShmPeerMemory::Line(int rank) const {
  static_assert(sizeof(RankLine) == 128, "a rank's line is two cache lines (LinesBytes)");
  return reinterpret_cast<RankLine*>(base_ + kPage) + rank;
}

std::atomic<uint64_t>* ShmPeerMemory::LaneRound() const {
  return &reinterpret_cast<Header*>(base_)->lane_round;
}

std::atomic<uint64_t>* ShmPeerMemory::LaneWords(int rank) const { return Line(rank)->lane; }

uint8_t* ShmPeerMemory::Area(int rank, int parity) const {
  return base_ + kPage + LinesBytes(size_) + (static_cast<size_t>(rank) * 2 + parity) * area_bytes_;
}

uint8_t* ShmPeerMemory::ControlRing(int peer, bool toward_zero) const {
  if (ring_bytes_ == 0 || peer < 1 || peer >= size_) return nullptr;
  const size_t index = static_cast<size_t>(peer - 1) * 2 + (toward_zero ? 0 : 1);
  return Area(size_, 0) + index * ring_bytes_;  // just past the last rank's areas
}

Status ShmPeerMemory::Sync() {
  const traffic::Timed waiting(traffic::kWAIT_NS);  // Note [Traffic]
  const uint64_t count = ++syncs_;
  RankLine* line = Line(rank_);
  line->syncs.store(count, std::memory_order_release);
  line->futex.store(static_cast<uint32_t>(count), std::memory_order_seq_cst);
  if (line->waiters.load(std::memory_order_seq_cst) != 0) FutexWakeAll(&line->futex);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Status s = WaitFor(peer, count);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status ShmPeerMemory::WaitFor(int peer, uint64_t count) {
  RankLine* theirs = Line(peer);
  auto arrived = [&] { return theirs->syncs.load(std::memory_order_acquire) >= count; };
  if (arrived()) return Status::OK();  // without reading the clock
  using Clock = std::chrono::steady_clock;
  using Seconds = std::chrono::duration<double>;
  const auto start = Clock::now();
  for (int i = 0; !arrived(); ++i) {
    if (i % 64 == 63) {
      const auto waited = Clock::now() - start;
      if (waited >= Seconds(kYieldSeconds)) break;
      if (waited >= Seconds(spin_seconds_)) ::sched_yield();
    }
    SO_CPU_RELAX();
  }
  while (!arrived()) {
    theirs->waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = theirs->futex.load(std::memory_order_seq_cst);
    if (!arrived()) FutexWait(&theirs->futex, seen, kAliveCheckSeconds);
    theirs->waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (!arrived() && Clock::now() - start >= Seconds(kAliveCheckSeconds) && PeerGone(peer)) {
      return Status::Transport(
          "rank " + std::to_string(peer) + " (pid " + std::to_string(theirs->pid) +
          ") ended while this rank waited for it in a shared-memory collective");
    }
  }
  return Status::OK();
}

bool ShmPeerMemory::PeerGone(int peer) const {
  // Ranks in different pid namespaces (containers sharing /dev/shm) cannot see each other's
  // processes: there a dead rank is left to the launcher.
  if (Line(peer)->pid_namespace == 0 || Line(peer)->pid_namespace != Line(rank_)->pid_namespace)
    return false;
  return ProcessGone(static_cast<pid_t>(Line(peer)->pid));
}

}  // namespace scaleout
