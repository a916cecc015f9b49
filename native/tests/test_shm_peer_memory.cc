// ShmPeerMemory between two real processes (this one and a forked child), bootstrapped over
// pipes: the areas are shared, Sync orders them, the segment's name is gone once both have
// it, and a rank that dies is named by the rank that waits for it. The control channel's rings
// in the segment carry messages both ways, in order.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/test_framework.h"
#include "common/process.h"
#include "transport/shm/shm_control_channel.h"
#include "transport/shm/shm_peer_memory.h"

namespace scaleout {
namespace {

// The two ranks' bootstrap: rank 0 is the parent, rank 1 the child; each end reads what the
// other writes. Only what ShmPeerMemory::Create uses is implemented.
class PipeTransport : public DataTransport {
 public:
  PipeTransport(int rank, int read_fd, int write_fd) : rank_(rank), in_(read_fd), out_(write_fd) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  Status Broadcast(void* buf, size_t bytes, int root) override {
    return rank_ == root ? Write(buf, bytes) : Read(buf, bytes);
  }
  Status Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override {
    if (count != 1 || dtype != DataType::kInt32 || op != ReduceOp::kMin)
      return Status::Internal("unused");
    int32_t mine, theirs;
    std::memcpy(&mine, in, sizeof mine);
    Status s = Write(&mine, sizeof mine);
    if (s.ok()) s = Read(&theirs, sizeof theirs);
    const int32_t least = mine < theirs ? mine : theirs;
    std::memcpy(out, &least, sizeof least);
    return s;
  }
  Status Allgatherv(const void*, size_t, void*, const std::vector<size_t>&) override {
    return Status::Internal("unused");
  }
  Status Sendrecv(const void*, size_t, int, void*) override { return Status::Internal("unused"); }
  Status Alltoallv(const void*, const std::vector<size_t>&, const std::vector<size_t>&, void*,
                   const std::vector<size_t>&, const std::vector<size_t>&) override {
    return Status::Internal("unused");
  }
  Status ReduceScatter(const void*, void*, const std::vector<size_t>&, DataType,
                       ReduceOp) override {
    return Status::Internal("unused");
  }

 private:
  Status Write(const void* buf, size_t bytes) {
    return ::write(out_, buf, bytes) == static_cast<ssize_t>(bytes)
               ? Status::OK()
               : Status::Transport("pipe write");
  }
  Status Read(void* buf, size_t bytes) {
    size_t got = 0;
    while (got < bytes) {
      ssize_t n = ::read(in_, static_cast<char*>(buf) + got, bytes - got);
      if (n <= 0) return Status::Transport("pipe read");
      got += static_cast<size_t>(n);
    }
    return Status::OK();
  }
  int rank_, in_, out_;
};

// Forks; the child runs `child(transport)` and exits with its return value. Returns the
// child's pid; *parent gets rank 0's end.
template <typename Child>
pid_t ForkRanks(std::unique_ptr<PipeTransport>* parent, Child child) {
  int down[2], up[2];
  if (::pipe(down) != 0 || ::pipe(up) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(down[1]);
    ::close(up[0]);
    PipeTransport transport(1, down[0], up[1]);
    ::_exit(child(transport));
  }
  ::close(down[0]);
  ::close(up[1]);
  *parent = std::make_unique<PipeTransport>(0, up[0], down[1]);
  return pid;
}

int ExitCode(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Names in /dev/shm that rank 0 (this process) would have created.
int SegmentsOf(pid_t pid) {
  const std::string prefix =
      "scaleout-" + std::to_string(PidNamespace()) + "-" + std::to_string(pid) + "-";
  int found = 0;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(dir)) found += std::string(e->d_name).rfind(prefix, 0) == 0;
    ::closedir(dir);
  }
  return found;
}

SO_TEST(TwoProcessesShareTheAreasInSyncOrder) {
  std::unique_ptr<PipeTransport> transport;
  const pid_t child = ForkRanks(&transport, [](PipeTransport& t) {
    std::unique_ptr<ShmPeerMemory> mem;
    if (!ShmPeerMemory::Create(&t, 4096, &mem).ok()) return 10;
    for (size_t i = 0; i < 4096; ++i) mem->Area(1, 0)[i] = static_cast<uint8_t>(i * 3);
    if (!mem->Sync().ok()) return 11;  // 1: rank 1's area 0 is written
    if (!mem->Sync().ok()) return 12;  // 2: rank 0's area 1 is written
    for (size_t i = 0; i < 4096; ++i) {
      if (mem->Area(0, 1)[i] != static_cast<uint8_t>(i ^ 0x5a)) return 13;
    }
    return 0;
  });
  ASSERT_TRUE(child > 0);
  std::unique_ptr<ShmPeerMemory> mem;
  Status s = ShmPeerMemory::Create(transport.get(), 4096, &mem);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(SegmentsOf(::getpid()), 0);  // unlinked once both ranks hold it
  EXPECT_EQ(mem->area_bytes(), 4096);
  EXPECT_TRUE(mem->Sync().ok());
  bool same = true;
  for (size_t i = 0; i < 4096; ++i)
    same = same && mem->Area(1, 0)[i] == static_cast<uint8_t>(i * 3);
  EXPECT_TRUE(same);
  for (size_t i = 0; i < 4096; ++i) mem->Area(0, 1)[i] = static_cast<uint8_t>(i ^ 0x5a);
  EXPECT_TRUE(mem->Sync().ok());
  EXPECT_EQ(ExitCode(child), 0);
}

SO_TEST(ARankThatDiesIsNamedByTheRankWaitingForIt) {
  std::unique_ptr<PipeTransport> transport;
  const pid_t child = ForkRanks(&transport, [](PipeTransport& t) {
    std::unique_ptr<ShmPeerMemory> mem;
    if (!ShmPeerMemory::Create(&t, 4096, &mem).ok()) return 10;
    if (!mem->Sync().ok()) return 11;
    return 0;  // ends without the second Sync; its parent has not reaped it yet
  });
  ASSERT_TRUE(child > 0);
  std::unique_ptr<ShmPeerMemory> mem;
  ASSERT_TRUE(ShmPeerMemory::Create(transport.get(), 4096, &mem).ok());
  EXPECT_TRUE(mem->Sync().ok());
  Status s = mem->Sync();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), SO_ERR_TRANSPORT);
  const std::string want = "rank 1 (pid " + std::to_string(child) + ") ended";
  if (!EXPECT_TRUE(s.message().find(want) != std::string::npos)) ADD_FAILURE(s.message());
  EXPECT_EQ(ExitCode(child), 0);
}

SO_TEST(AFailureOnOneRankFailsCreateOnBoth) {
  // Rank 1 asks for a different area size, so the segment it finds is not the size it expects.
  std::unique_ptr<PipeTransport> transport;
  const pid_t child = ForkRanks(&transport, [](PipeTransport& t) {
    std::unique_ptr<ShmPeerMemory> mem;
    Status s = ShmPeerMemory::Create(&t, 8192, &mem);
    return s.ok() || mem != nullptr || s.message().find("not the size") == std::string::npos ? 1
                                                                                             : 0;
  });
  ASSERT_TRUE(child > 0);
  std::unique_ptr<ShmPeerMemory> mem;
  Status s = ShmPeerMemory::Create(transport.get(), 4096, &mem);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(mem == nullptr);
  EXPECT_EQ(ExitCode(child), 0);
  EXPECT_EQ(SegmentsOf(::getpid()), 0);
}

bool Exists(const std::string& name) { return ::access(("/dev/shm" + name).c_str(), F_OK) == 0; }

SO_TEST(SegmentsLeftByAKilledJobAreRemovedByTheNextOne) {
  // A name as rank 0 of a job killed during set-up leaves it: its pid is gone.
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_TRUE(gone > 0);
  ExitCode(gone);
  const std::string stale =
      "/scaleout-" + std::to_string(PidNamespace()) + "-" + std::to_string(gone) + "-deadbeef";
  // The same pid in another pid namespace (a container sharing /dev/shm) may be a live job
  // setting up: kept. So is a name without a namespace (an older version's).
  const std::string elsewhere =
      "/scaleout-" + std::to_string(PidNamespace() + 1) + "-" + std::to_string(gone) + "-deadbeef";
  const std::string unknown = "/scaleout-" + std::to_string(gone) + "-deadbeef";
  for (const std::string& name : {stale, elsewhere, unknown}) {
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_TRUE(fd >= 0);
    ::close(fd);
  }
  ASSERT_EQ(SegmentsOf(gone), 1);
  std::unique_ptr<PipeTransport> transport;
  const pid_t child = ForkRanks(&transport, [](PipeTransport& t) {
    std::unique_ptr<ShmPeerMemory> mem;
    return ShmPeerMemory::Create(&t, 4096, &mem).ok() ? 0 : 1;
  });
  ASSERT_TRUE(child > 0);
  std::unique_ptr<ShmPeerMemory> mem;
  EXPECT_TRUE(ShmPeerMemory::Create(transport.get(), 4096, &mem).ok());
  EXPECT_EQ(ExitCode(child), 0);
  EXPECT_FALSE(Exists(stale));
  EXPECT_TRUE(Exists(elsewhere));
  EXPECT_TRUE(Exists(unknown));
  for (const std::string& name : {stale, elsewhere, unknown}) ::shm_unlink(name.c_str());
}

// The overflow channel of a test whose messages always fit in the rings.
class NoOverflow : public ControlChannel {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status Send(int, std::vector<uint8_t>) override { return Status::Internal("overflowed"); }
  Status TryReceive(bool* got, int*, std::vector<uint8_t>*) override {
    *got = false;
    return Status::OK();
  }
  Status TryReceiveFrom(int, bool* got, std::vector<uint8_t>*) override {
    *got = false;
    return Status::OK();
  }
};

std::unique_ptr<ShmControlChannel> ControlOver(const ShmPeerMemory& mem) {
  return std::make_unique<ShmControlChannel>(
      mem.rank(), mem.size(),
      [&mem](int peer, bool toward_zero) { return mem.ControlRing(peer, toward_zero); },
      std::make_unique<NoOverflow>());
}

// Rounds of: rank 1 sends a burst of numbered messages of varied sizes, rank 0 answers each
// burst with their sum; both check every byte, while the other process runs at once.
SO_TEST(TwoProcessesTalkThroughTheControlRings) {
  constexpr int kRounds = 2000;
  constexpr int kBurst = 20;
  std::unique_ptr<PipeTransport> transport;
  const pid_t child = ForkRanks(&transport, [](PipeTransport& t) {
    std::unique_ptr<ShmPeerMemory> mem;
    if (!ShmPeerMemory::Create(&t, 4096, &mem, ShmControlChannel::RingBytes()).ok()) return 10;
    auto channel = ControlOver(*mem);
    uint32_t n = 0;
    for (int round = 0; round < kRounds; ++round) {
      uint64_t sum = 0;
      for (int i = 0; i < kBurst; ++i, ++n) {
        std::vector<uint8_t> m(4 + (n * 7) % 300, static_cast<uint8_t>(n));
        std::memcpy(m.data(), &n, 4);
        sum += n;
        if (!channel->Send(0, std::move(m)).ok()) return 11;
      }
      bool got = false;
      std::vector<uint8_t> answer;
      while (!got) {
        if (!channel->TryReceiveFrom(0, &got, &answer).ok()) return 12;
      }
      uint64_t echoed = 0;
      if (answer.size() != sizeof echoed) return 13;
      std::memcpy(&echoed, answer.data(), sizeof echoed);
      if (echoed != sum) return 14;
    }
    return 0;
  });
  ASSERT_TRUE(child > 0);
  std::unique_ptr<ShmPeerMemory> mem;
  ASSERT_TRUE(
      ShmPeerMemory::Create(transport.get(), 4096, &mem, ShmControlChannel::RingBytes()).ok());
  auto channel = ControlOver(*mem);
  uint32_t expected = 0;
  int bad = 0;
  for (int round = 0; round < kRounds && bad == 0; ++round) {
    uint64_t sum = 0;
    for (int i = 0; i < kBurst; ++i, ++expected) {
      bool got = false;
      int src = -1;
      std::vector<uint8_t> m;
      while (!got && bad == 0) bad += !channel->TryReceive(&got, &src, &m).ok();
      uint32_t n = 0;
      if (m.size() >= 4) std::memcpy(&n, m.data(), 4);
      bool intact = src == 1 && n == expected && m.size() == 4 + (n * 7) % 300;
      for (size_t k = 4; intact && k < m.size(); ++k) intact = m[k] == static_cast<uint8_t>(n);
      bad += !intact;
      sum += n;
    }
    std::vector<uint8_t> answer(sizeof sum);
    std::memcpy(answer.data(), &sum, sizeof sum);
    bad += !channel->Send(1, std::move(answer)).ok();
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(ExitCode(child), 0);
}

}  // namespace
}  // namespace scaleout
