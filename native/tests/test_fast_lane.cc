// Note [Fast lane]: the rounds' decisions (threads playing the ranks, over SharedAreas), and a
// one-Sync allreduce agreed on the lane instead of synced.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collectives/fast_lane.h"
#include "collectives/staged_allreduce.h"
#include "tests/shared_areas.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

using test::SharedAreas;
using Barrier = test::ThreadBarrier;

LanePost Post(uint64_t key) {
  LanePost p;
  p.key = key;
  p.count = 4;
  p.shape = 7;
  return p;
}

// Each iteration every rank posts (the same key, or in every third iteration one rank another);
// a round is agreed by all or by none, and only where every rank posted the same.
SO_TEST(ARoundIsAgreedByEveryRankOrByNone) {
  for (int size : {2, 3, 4}) {
    SharedAreas shared(size, 4096);
    Barrier barrier(size);
    constexpr int kIterations = 300;
    std::vector<std::vector<int>> agreed(size, std::vector<int>(kIterations, -1));
    std::vector<std::thread> threads;
    for (int g = 0; g < size; ++g) {
      threads.emplace_back([&, g] {
        SharedAreas::View view(&shared, g);
        FastLane lane(&view);
        lane.SpinFirst(false);  // threads may outnumber the cores
        for (int i = 0; i < kIterations; ++i) {
          const bool odd_one = i % 3 == 2 && g == i % size;
          agreed[g][i] = lane.Agree(Post(odd_one ? 2 : 1)) ? 1 : 0;
          barrier.Wait();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    int agreed_rounds = 0;
    for (int i = 0; i < kIterations; ++i) {
      for (int g = 1; g < size; ++g) {
        if (!EXPECT_EQ(agreed[g][i], agreed[0][i]))
          ADD_FAILURE("size " + std::to_string(size) + " iteration " + std::to_string(i));
      }
      if (i % 3 == 2) EXPECT_EQ(agreed[0][i], 0);
      agreed_rounds += agreed[0][i];
    }
    // Rounds where all posted the same are agreed unless a rank came after the give-up time
    // (the machine is busy with other tests): most are.
    EXPECT_TRUE(agreed_rounds > kIterations / 3);
  }
}

// A rank with work in negotiation calls off the round another waits in; one that never comes
// makes the waiting rank give up; and the lane goes on agreeing afterwards.
SO_TEST(CallOffAndGiveUpEndAWaitAndTheLaneGoesOn) {
  SharedAreas shared(2, 4096);
  SharedAreas::View v0(&shared, 0), v1(&shared, 1);
  FastLane a(&v0), b(&v1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(a.Agree(Post(1)));  // rank 1 never comes: given up
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(waited >= FastLane::kGiveUpSeconds);
  // Rank 1 goes off the lane (work in negotiation) while rank 0 waits in a round: called off.
  std::atomic<bool> done{false};
  bool a_agreed = true;
  std::thread waiter([&] {
    a_agreed = a.Agree(Post(1));
    done = true;
  });
  while (!done) b.SetAway(true);
  waiter.join();
  EXPECT_FALSE(a_agreed);
  // While it stays off, nothing is agreed (even with its post the same); once back, it is.
  {
    bool first = true;
    std::thread t1([&] { first = a.Agree(Post(6)); });
    EXPECT_FALSE(b.Agree(Post(6)));
    t1.join();
    EXPECT_FALSE(first);
  }
  b.SetAway(false);
  bool first = false, second = false;
  std::thread t1([&] { first = a.Agree(Post(5)); });
  second = b.Agree(Post(5));
  t1.join();
  EXPECT_EQ(first, second);
}

// A one-Sync allreduce agreed on the lane gives what the synced one gives, and the two can take
// turns (the parities stay in step); a round not agreed writes nothing.
SO_TEST(AnAgreedAllreduceIsTheOneSyncAllreduce) {
  for (int size : {2, 3}) {
    SharedAreas shared(size, size_t(1) << 16);
    Barrier barrier(size);
    std::vector<int> failures(size, 0);
    std::vector<std::thread> threads;
    for (int g = 0; g < size; ++g) {
      threads.emplace_back([&, g] {
        SharedAreas::View view(&shared, g);
        StagedAllreduce staged(&view);
        FastLane lane(&view);
        lane.SpinFirst(false);
        std::vector<float> data(256);
        for (int rep = 0; rep < 60; ++rep) {
          for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(g + rep + i % 5);
          auto pack = [&](size_t first, size_t count, uint8_t* dst) {
            std::memcpy(dst, data.data() + first, count * sizeof(float));
          };
          auto unpack = [&](size_t, size_t, const uint8_t*) {};
          auto output = [&](size_t first, size_t, double* post) {
            *post = 1.0;
            return reinterpret_cast<uint8_t*>(data.data() + first);
          };
          bool agreed = true;
          Status s;
          if (rep % 4 == 3) {  // a synced one between
            s = staged.Run(data.size(), DataType::kFloat32, ReduceOp::kSum, pack, unpack,
                           HalfFactors(), nullptr, output);
          } else {
            // In every fourth-but-one round rank 0 posts another shape: not agreed.
            const bool odd = rep % 4 == 1 && g == 0;
            LanePost post = Post(1);
            if (odd) post.shape = 8;
            s = staged.RunAgreed(
                data.size(), DataType::kFloat32, ReduceOp::kSum, pack, unpack, output,
                [&] { return lane.Agree(post); }, &agreed);
            if (rep % 4 == 1 && agreed) ++failures[g];  // must not be agreed
          }
          if (!s.ok()) ++failures[g];
          for (size_t i = 0; i < data.size(); ++i) {
            float sum = 0;
            for (int r = 0; r < size; ++r) sum += static_cast<float>(r + rep + i % 5);
            const float own = static_cast<float>(g + rep + i % 5);
            // Agreed: the sum; not agreed (or given up on a busy machine): untouched.
            if (data[i] != (agreed ? sum : own)) ++failures[g];
          }
          // Where a round was not agreed, all ranks must still be in step: a synced allreduce
          // follows (the collective goes to negotiation, which runs it with a Sync).
          if (!agreed) {
            s = staged.Run(data.size(), DataType::kFloat32, ReduceOp::kSum, pack, unpack,
                           HalfFactors(), nullptr, output);
            if (!s.ok()) ++failures[g];
          }
          barrier.Wait();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int g = 0; g < size; ++g) EXPECT_EQ(failures[g], 0);
  }
}

}  // namespace
}  // namespace scaleout
