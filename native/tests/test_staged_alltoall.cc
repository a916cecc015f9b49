// StagedAlltoall (Note [Staged alltoall]) over an in-process PeerMemory whose "ranks" are
// threads (tests/shared_areas.h): uneven and empty sends, many rounds, back-to-back runs mixed
// with staged allreduces on the same areas, and a failed Sync.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/staged_allreduce.h"
#include "collectives/staged_alltoall.h"
#include "tests/shared_areas.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

using test::CrossGroup;
using test::SharedAreas;

// Rows rank j sends rank k in repetition `rep`: uneven, some pairs none.
int64_t Rows(int j, int k, int rep, int64_t scale) { return (j * 7 + k * 3 + rep) % 4 * scale; }

// Row i from j to k in repetition rep: three int32 values naming it.
void FillRow(int32_t* row, int j, int k, int64_t i, int rep) {
  row[0] = j;
  row[1] = k * 1000 + rep;
  row[2] = static_cast<int32_t>(i);
}

struct Run {
  std::vector<std::vector<int32_t>> results;
  std::vector<std::vector<int64_t>> received;
  std::vector<Status> status;
  std::vector<std::vector<size_t>> moved;  // bytes rank j sent rank k over the fake MPI
};

// Where the ranks are: machine_of[r] is rank r's machine. One machine: the areas alone carry
// everything. Several: the areas inside each machine, a fake MPI over every rank across; with
// `shared` false, no areas at all (every pair over the fake MPI).
struct Layout {
  std::vector<int> machine_of;
  bool shared = true;

  static Layout OneMachine(int size) { return Layout{std::vector<int>(size, 0)}; }
  int size() const { return static_cast<int>(machine_of.size()); }
  bool across() const {
    return !shared ||
           std::any_of(machine_of.begin(), machine_of.end(), [](int m) { return m != 0; });
  }
};

// Each rank thread runs `repeats` alltoalls (with a staged allreduce over its machine between
// them when `mix_allreduce`), checking nothing itself; the last repetition's results are
// returned.
Run RunRanks(const Layout& layout, size_t area_bytes, int64_t scale, int repeats,
             bool mix_allreduce, uint64_t fail_at = 0) {
  const int size = layout.size();
  int machines = 0;
  for (int m : layout.machine_of) machines = std::max(machines, m + 1);
  std::vector<int> local_rank_of(size), local_size(machines, 0);
  for (int q = 0; q < size; ++q) local_rank_of[q] = local_size[layout.machine_of[q]]++;
  std::vector<std::unique_ptr<SharedAreas>> shared;
  for (int m = 0; m < machines; ++m) {
    shared.push_back(std::make_unique<SharedAreas>(local_size[m], area_bytes, fail_at));
  }
  CrossGroup all(size);
  Run out;
  out.results.resize(size);
  out.received.resize(size);
  out.status.resize(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      const int machine = layout.machine_of[r];
      SharedAreas::View view(shared[machine].get(), local_rank_of[r]);
      CrossGroup::Member member(&all, r);
      PeerMemory* memory = layout.shared ? &view : nullptr;
      StagedAlltoall alltoall =
          layout.across() ? StagedAlltoall(memory, &member, layout.machine_of, local_rank_of)
                          : StagedAlltoall(&view);
      StagedAllreduce allreduce(&view);
      std::mt19937 jitter(r);
      for (int rep = 0; rep < repeats && out.status[r].ok(); ++rep) {
        std::vector<int64_t> send(size);
        std::vector<int32_t> input;
        for (int k = 0; k < size; ++k) {
          send[k] = Rows(r, k, rep, scale);
          for (int64_t i = 0; i < send[k]; ++i) {
            int32_t row[3];
            FillRow(row, r, k, i, rep);
            input.insert(input.end(), row, row + 3);
          }
        }
        if (jitter() % 3 == 0) std::this_thread::yield();
        out.status[r] = alltoall.Run(
            reinterpret_cast<const uint8_t*>(input.data()), send, 3 * sizeof(int32_t),
            [&](const std::vector<int64_t>& received) {
              int64_t rows = 0;
              for (int64_t n : received) rows += n;
              out.results[r].assign(static_cast<size_t>(rows) * 3, -1);
              return reinterpret_cast<uint8_t*>(out.results[r].data());
            },
            &out.received[r]);
        if (mix_allreduce && out.status[r].ok()) {
          std::vector<int64_t> values(3000, r + rep);
          out.status[r] = allreduce.Run(
              values.size(), DataType::kInt64, ReduceOp::kSum,
              [&](size_t first, size_t count, uint8_t* dst) {
                std::memcpy(dst, values.data() + first, count * sizeof(int64_t));
              },
              [&](size_t first, size_t count, const uint8_t* src) {
                std::memcpy(values.data() + first, src, count * sizeof(int64_t));
              });
          int64_t want = 0;
          for (int q = 0; q < size; ++q) want += layout.machine_of[q] == machine ? q + rep : 0;
          for (int64_t v : values) {
            if (v != want) {
              out.status[r] =
                  Status::Internal("allreduce between alltoalls: got " + std::to_string(v));
              break;
            }
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  out.moved.assign(size, std::vector<size_t>(size));
  for (int j = 0; j < size; ++j) {
    for (int k = 0; k < size; ++k) out.moved[j][k] = all.Moved(j, k);
  }
  return out;
}

void ExpectDelivered(const Run& out, int size, int64_t scale, int rep, const std::string& what) {
  for (int r = 0; r < size; ++r) {
    if (!EXPECT_TRUE(out.status[r].ok())) {
      ADD_FAILURE(what + ": rank " + std::to_string(r) + ": " + out.status[r].message());
      continue;
    }
    std::vector<int32_t> want;
    std::vector<int64_t> received;
    for (int j = 0; j < size; ++j) {
      received.push_back(Rows(j, r, rep, scale));
      for (int64_t i = 0; i < Rows(j, r, rep, scale); ++i) {
        int32_t row[3];
        FillRow(row, j, r, i, rep);
        want.insert(want.end(), row, row + 3);
      }
    }
    if (!EXPECT_TRUE(out.received[r] == received) || !EXPECT_TRUE(out.results[r] == want)) {
      ADD_FAILURE(what + ": rank " + std::to_string(r) + " of " + std::to_string(size));
    }
  }
}

SO_TEST(StagedAlltoallSlotsAreWholeLinesAfterTheHeader) {
  EXPECT_EQ(StagedAlltoall::SlotBytes(4096, 4), 960);  // (4096 - 64) / 4, down to a line
  EXPECT_EQ(StagedAlltoall::SlotBytes(4096, 1), 4032);
  EXPECT_EQ(StagedAlltoall::SlotBytes(128, 4), 0);  // too small: Run refuses
}

SO_TEST(StagedAlltoallDeliversUnevenSendsInOneOrManyRounds) {
  for (int size : {1, 2, 3, 4, 5}) {
    for (size_t area : {size_t(4096), size_t(1) << 20}) {
      for (int64_t scale : {0, 1, 37, 500}) {
        Run out = RunRanks(Layout::OneMachine(size), area, scale, 1, false);
        ExpectDelivered(out, size, scale, 0,
                        "area " + std::to_string(area) + " scale " + std::to_string(scale));
      }
    }
  }
}

SO_TEST(StagedAlltoallBackToBackAndBetweenAllreducesReusesTheAreasSafely) {
  // The parity alternates across both algorithms (PeerMemory::NextParity): jittered ranks must
  // never read an area that a faster rank is already rewriting.
  for (int size : {2, 3, 4}) {
    Run out = RunRanks(Layout::OneMachine(size), 4096, 50, 40, true);
    ExpectDelivered(out, size, 50, 39, "mixed with allreduces");
  }
}

SO_TEST(StagedAlltoallTooSmallAreaAndFailedSyncReturnAnError) {
  Run small = RunRanks(Layout::OneMachine(4), 128, 1, 1, false);
  for (const Status& s : small.status) {
    EXPECT_EQ(s.code(), SO_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(s.message().find("too small") != std::string::npos);
  }
  Run failed = RunRanks(Layout::OneMachine(3), 4096, 100, 1, false, /*fail_at=*/2);
  for (const Status& s : failed.status) EXPECT_EQ(s.code(), SO_ERR_TRANSPORT);
}

SO_TEST(AlltoallAcrossMachinesKeepsEachMachinesPairsOffMpi) {
  // 2-8 ranks on 1-3 machines, machines' ranks interleaved and of different sizes: every row
  // arrives, and over MPI each pair on one machine moves only its 8-byte count per alltoall.
  for (const std::vector<int>& machine_of :
       {std::vector<int>{0, 1}, std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 0, 1},
        std::vector<int>{0, 0, 1}, std::vector<int>{1, 0, 0, 0}, std::vector<int>{0, 0, 0, 1, 1, 1},
        std::vector<int>{0, 0, 0, 1, 1, 1, 2, 2}, std::vector<int>{2, 0, 1, 0, 2, 1, 0, 1}}) {
    const Layout layout{machine_of};
    const int size = layout.size();
    for (size_t area : {size_t(4096), size_t(1) << 20}) {
      const int repeats = 5;
      Run out = RunRanks(layout, area, 37, repeats, true);
      const std::string what = std::to_string(size) + " ranks, area " + std::to_string(area);
      ExpectDelivered(out, size, 37, repeats - 1, what);
      for (int j = 0; j < size; ++j) {
        for (int k = 0; k < size; ++k) {
          size_t data = 0;  // the rows j sent k over every repetition
          for (int rep = 0; rep < repeats; ++rep) data += Rows(j, k, rep, 37) * 3 * sizeof(int32_t);
          const size_t want =
              repeats * sizeof(int64_t) + (machine_of[j] == machine_of[k] ? 0 : data);
          if (!EXPECT_EQ(out.moved[j][k], want)) {
            ADD_FAILURE(what + ": over MPI from " + std::to_string(j) + " to " + std::to_string(k));
          }
        }
      }
    }
  }
}

SO_TEST(AlltoallWithoutSharedMemorySendsEveryPairOverMpi) {
  for (int size : {1, 2, 3, 5}) {
    Layout layout = Layout::OneMachine(size);
    layout.shared = false;
    Run out = RunRanks(layout, 4096, 37, 3, false);
    ExpectDelivered(out, size, 37, 2, "without shared memory");
    const size_t data =
        Rows(1 % size, 0, 0, 37) + Rows(1 % size, 0, 1, 37) + Rows(1 % size, 0, 2, 37);
    EXPECT_EQ(out.moved[1 % size][0], 3 * sizeof(int64_t) + data * 3 * sizeof(int32_t));
  }
}

}  // namespace
}  // namespace scaleout
