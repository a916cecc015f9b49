// StagedAlltoall (Note [Staged alltoall]) over an in-process PeerMemory whose "ranks" are
// threads (tests/shared_areas.h): uneven and empty sends, many rounds, back-to-back runs mixed
// with staged allreduces on the same areas, and a failed Sync.
#include <cstdint>
#include <cstring>
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
};

// Each rank thread runs `repeats` alltoalls (with a staged allreduce between them when
// `mix_allreduce`), checking nothing itself; the last repetition's results are returned.
Run RunRanks(int size, size_t area_bytes, int64_t scale, int repeats, bool mix_allreduce,
             uint64_t fail_at = 0) {
  SharedAreas shared(size, area_bytes, fail_at);
  Run out;
  out.results.resize(size);
  out.received.resize(size);
  out.status.resize(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      SharedAreas::View view(&shared, r);
      StagedAlltoall alltoall(&view);
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
          const int64_t want = static_cast<int64_t>(size) * (size - 1) / 2 + size * rep;
          for (int64_t v : values) {
            if (v != want) {
              out.status[r] = Status::Internal("allreduce between alltoalls: got " +
                                               std::to_string(v));
              break;
            }
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
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
  EXPECT_EQ(StagedAlltoall::SlotBytes(128, 4), 0);     // too small: Run refuses
}

SO_TEST(StagedAlltoallDeliversUnevenSendsInOneOrManyRounds) {
  for (int size : {1, 2, 3, 4, 5}) {
    for (size_t area : {size_t(4096), size_t(1) << 20}) {
      for (int64_t scale : {0, 1, 37, 500}) {
        Run out = RunRanks(size, area, scale, 1, false);
        ExpectDelivered(out, size, scale, 0, "area " + std::to_string(area) + " scale " +
                                                 std::to_string(scale));
      }
    }
  }
}

SO_TEST(StagedAlltoallBackToBackAndBetweenAllreducesReusesTheAreasSafely) {
  // The parity alternates across both algorithms (PeerMemory::NextParity): jittered ranks must
  // never read an area that a faster rank is already rewriting.
  for (int size : {2, 3, 4}) {
    Run out = RunRanks(size, 4096, 50, 40, true);
    ExpectDelivered(out, size, 50, 39, "mixed with allreduces");
  }
}

SO_TEST(StagedAlltoallTooSmallAreaAndFailedSyncReturnAnError) {
  Run small = RunRanks(4, 128, 1, 1, false);
  for (const Status& s : small.status) {
    EXPECT_EQ(s.code(), SO_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(s.message().find("too small") != std::string::npos);
  }
  Run failed = RunRanks(3, 4096, 100, 1, false, /*fail_at=*/2);
  for (const Status& s : failed.status) EXPECT_EQ(s.code(), SO_ERR_TRANSPORT);
}

}  // namespace
}  // namespace scaleout
