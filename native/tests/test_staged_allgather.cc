// StagedAllgather (Note [Staged allgather]) over an in-process PeerMemory whose "ranks" are
// threads (tests/shared_areas.h): blocks of different sizes (some empty, some many areas
// long), back-to-back runs with jittered ranks, and a failed Sync.
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/staged_allgather.h"
#include "tests/shared_areas.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

using test::SharedAreas;

// Rank q's block in repetition rep: (q * 7 + rep) % 5 * scale bytes, naming q, rep and i.
std::vector<uint8_t> Block(int q, int rep, size_t scale) {
  std::vector<uint8_t> b((q * 7 + rep) % 5 * scale);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(q * 31 + rep * 7 + i);
  return b;
}

// Every rank's result of the last repetition, or "" where it was right (errors recorded, the
// ranks go on so none waits for a peer that stopped).
std::vector<std::string> RunRanks(int size, size_t area, size_t scale, int repeats,
                                  uint64_t fail_at = 0, std::vector<Status>* statuses = nullptr) {
  SharedAreas shared(size, area, fail_at);
  std::vector<std::string> errors(size);
  std::vector<Status> status(size);
  std::vector<std::thread> threads;
  for (int q = 0; q < size; ++q) {
    threads.emplace_back([&, q] {
      SharedAreas::View view(&shared, q);
      StagedAllgather gather(&view);
      std::mt19937 jitter(q);
      for (int rep = 0; rep < repeats && status[q].ok(); ++rep) {
        std::vector<size_t> recv_bytes;
        std::vector<uint8_t> want;
        for (int k = 0; k < size; ++k) {
          std::vector<uint8_t> b = Block(k, rep, scale);
          recv_bytes.push_back(b.size());
          want.insert(want.end(), b.begin(), b.end());
        }
        if (jitter() % 3 == 0) std::this_thread::yield();
        std::vector<uint8_t> mine = Block(q, rep, scale), got(want.size(), 0xee);
        status[q] = gather.Run(mine.data(), mine.size(), got.data(), recv_bytes);
        if (status[q].ok() && got != want && errors[q].empty()) {
          errors[q] = "wrong bytes at repetition " + std::to_string(rep);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (statuses != nullptr) *statuses = status;
  return errors;
}

SO_TEST(StagedAllgatherGathersEveryBlockInOneOrManyRounds) {
  for (int size : {1, 2, 3, 4, 5}) {
    for (size_t area : {size_t(256), size_t(1) << 16}) {
      for (size_t scale : {size_t(0), size_t(1), size_t(37), size_t(1000)}) {
        std::vector<std::string> errors = RunRanks(size, area, scale, 12);
        for (int q = 0; q < size; ++q) {
          if (!EXPECT_TRUE(errors[q].empty())) {
            ADD_FAILURE(std::to_string(size) + " ranks, area " + std::to_string(area) + ", scale " +
                        std::to_string(scale) + ": rank " + std::to_string(q) + ": " + errors[q]);
          }
        }
      }
    }
  }
}

SO_TEST(StagedAllgatherReturnsAFailedSync) {
  std::vector<Status> status;
  RunRanks(3, 256, 1000, 1, /*fail_at=*/2, &status);
  for (const Status& s : status) EXPECT_EQ(s.code(), SO_ERR_TRANSPORT);
}

}  // namespace
}  // namespace scaleout
