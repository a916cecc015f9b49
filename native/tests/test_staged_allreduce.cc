// StagedAllreduce (Note [Staged allreduce]) over an in-process PeerMemory whose "ranks" are
// threads (tests/shared_areas.h): slices, rounds, every op's result on every rank, and failures
// of Sync.
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/endpoint_pool.h"
#include "collectives/machine_reduce.h"
#include "collectives/reduce_kernels.h"
#include "collectives/staged_allreduce.h"
#include "tests/shared_areas.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

using test::CrossGroup;
using test::SharedAreas;

// Runs one StagedAllreduce per rank thread over int64 inputs, `size` ranks on each of
// `machines` machines (hierarchical when more than one, Note [Hierarchical allreduce]);
// returns what each rank (machine-major) unpacked and how many times each element was
// unpacked on each rank.
struct Outcome {
  std::vector<std::vector<int64_t>> results;
  std::vector<std::vector<int>> unpacked;
  std::vector<Status> status;
  std::vector<size_t> packed;  // elements each rank packed in its last repetition
};

constexpr size_t kPiece = 37;  // the elements of each tensor an InputFn serves

// Rank g's `repeats` runs: element i of repetition rep is (i % 11) * (g + 1) + rep on rank g;
// what it unpacks, and how often, goes into out (the last repetition's stays). With
// `with_input`, the run may also reduce from where the rank's elements lie instead of packing
// them (StagedAllreduce::InputFn).
void RunRepetitions(StagedAllreduce& staged, int g, size_t total, ReduceOp op, int repeats,
                    bool with_input, Outcome* out) {
  std::mt19937 jitter(g);
  std::vector<int64_t> input(total);
  for (int rep = 0; rep < repeats && out->status[g].ok(); ++rep) {
    std::fill(out->unpacked[g].begin(), out->unpacked[g].end(), 0);
    for (size_t i = 0; i < total; ++i) input[i] = static_cast<int64_t>(i % 11) * (g + 1) + rep;
    out->packed[g] = 0;
    auto pack = [&](size_t first, size_t count, uint8_t* dst) {
      if (jitter() % 4 == 0) std::this_thread::yield();
      std::memcpy(dst, input.data() + first, count * sizeof(int64_t));
      out->packed[g] += count;
    };
    StagedAllreduce::InputFn in;
    if (with_input) {
      // As fused tensors of kPiece elements each, every third of which cannot be read as it
      // lies (a joined rank's zeros, a prescale): those are packed.
      in = [&](size_t first, size_t count, size_t* run) -> const uint8_t* {
        *run = std::min(count, kPiece - first % kPiece);
        if (first / kPiece % 3 == 2) return nullptr;
        return reinterpret_cast<const uint8_t*>(input.data() + first);
      };
    }
    auto unpack = [&](size_t first, size_t count, const uint8_t* src) {
      const auto* s = reinterpret_cast<const int64_t*>(src);
      for (size_t i = 0; i < count; ++i) {
        out->results[g][first + i] = s[i];
        ++out->unpacked[g][first + i];
      }
    };
    out->status[g] = staged.Run(total, DataType::kInt64, op, pack, unpack, HalfFactors(), in);
  }
}

Outcome RunRanks(int size, size_t area_bytes, size_t total, ReduceOp op, int repeats = 1,
                 uint64_t fail_at = 0, int machines = 1, int servers = 1, bool with_input = false) {
  std::vector<std::unique_ptr<SharedAreas>> shared;
  for (int m = 0; m < machines; ++m) {
    shared.push_back(std::make_unique<SharedAreas>(size, area_bytes, fail_at));
  }
  // groups[r * servers + i]: endpoint server i's cross transports of local rank r.
  std::vector<std::unique_ptr<CrossGroup>> groups;
  for (int r = 0; r < size * servers; ++r) groups.push_back(std::make_unique<CrossGroup>(machines));
  const int ranks = size * machines;
  Outcome out;
  out.results.assign(ranks, std::vector<int64_t>(total, -999));
  out.unpacked.assign(ranks, std::vector<int>(total, 0));
  out.status.resize(ranks);
  out.packed.assign(ranks, 0);
  std::vector<std::thread> threads;
  for (int g = 0; g < ranks; ++g) {
    threads.emplace_back([&, g] {
      const int m = g / size, r = g % size;
      SharedAreas::View view(shared[m].get(), r);
      std::vector<std::unique_ptr<CrossGroup::Member>> members;
      std::vector<DataTransport*> cross;
      for (int i = 0; i < servers; ++i) {
        members.push_back(std::make_unique<CrossGroup::Member>(groups[r * servers + i].get(), m));
        cross.push_back(members.back().get());
      }
      EndpointPool pool(servers, {});
      MachineReduce across(cross, &pool);
      StagedAllreduce staged(&view, machines > 1 ? &across : nullptr);
      RunRepetitions(staged, g, total, op, repeats, with_input, &out);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

int64_t Expected(size_t i, int size, ReduceOp op, int rep) {
  int64_t acc = op == ReduceOp::kProduct ? 1
                                         : (op == ReduceOp::kMin   ? INT64_MAX
                                            : op == ReduceOp::kMax ? INT64_MIN
                                                                   : 0);
  for (int r = 0; r < size; ++r) {
    const int64_t v = static_cast<int64_t>(i % 11) * (r + 1) + rep;
    if (op == ReduceOp::kSum) acc += v;
    if (op == ReduceOp::kMin) acc = std::min(acc, v);
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
    if (op == ReduceOp::kProduct) acc *= v;
  }
  return acc;
}

SO_TEST(SlicesCoverTheRoundInWholeLinesWithoutOverlap) {
  for (size_t esize : {1, 2, 4, 8}) {
    for (int size : {1, 2, 3, 4, 7}) {
      for (size_t count : {0, 1, 15, 16, 17, 64, 100, 1000, 4097}) {
        size_t expect_lo = 0;
        for (int k = 0; k < size; ++k) {
          size_t lo, hi;
          StagedAllreduce::Slice(count, esize, k, size, &lo, &hi);
          if (!EXPECT_EQ(lo, expect_lo) || !EXPECT_TRUE(hi >= lo)) {
            ADD_FAILURE("esize " + std::to_string(esize) + " size " + std::to_string(size) +
                        " count " + std::to_string(count));
          }
          if (hi < count) EXPECT_EQ(hi * esize % 64, 0);  // boundaries on 64-byte lines
          expect_lo = hi;
        }
        EXPECT_EQ(expect_lo, count);
      }
    }
  }
}

SO_TEST(EveryRankGetsTheReductionOfEveryElementOnce) {
  // Area sizes from 8 elements (many rounds, slices shorter than a line) to the whole input.
  for (int size : {1, 2, 3, 4}) {
    for (size_t area : {size_t(64), size_t(512), size_t(8) << 10, size_t(1) << 20}) {
      for (size_t total : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(12345)}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
          if (op == ReduceOp::kProduct && total > 1000) continue;
          Outcome o = RunRanks(size, area, total, op);
          const std::string where = "size " + std::to_string(size) + " area " +
                                    std::to_string(area) + " total " + std::to_string(total) +
                                    " op " + std::to_string(static_cast<int>(op));
          for (int r = 0; r < size; ++r) {
            if (!EXPECT_TRUE(o.status[r].ok())) ADD_FAILURE(where + ": " + o.status[r].message());
            for (size_t i = 0; i < total; ++i) {
              if (!EXPECT_EQ(o.results[r][i], Expected(i, size, op, 0)) ||
                  !EXPECT_EQ(o.unpacked[r][i], 1)) {
                ADD_FAILURE(where + " rank " + std::to_string(r) + " element " + std::to_string(i));
                break;
              }
            }
          }
        }
      }
    }
  }
}

SO_TEST(OwnersReduceFromTheirInputWithoutPackingIt) {
  // With an InputFn each rank packs only the slices it does not own (and the pieces of its own
  // that the InputFn does not give) and gets the same results, round after round (Note [Staged
  // allreduce]).
  for (int size : {2, 3, 4}) {
    for (size_t area : {size_t(512), size_t(8) << 10, size_t(1) << 20}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
        const size_t total = 12345;
        Outcome o = RunRanks(size, area, total, op, 3, 0, 1, 1, true);
        const std::string where = "size " + std::to_string(size) + " area " + std::to_string(area) +
                                  " op " + std::to_string(static_cast<int>(op));
        const size_t per_round = area / sizeof(int64_t);
        for (int r = 0; r < size; ++r) {
          if (!EXPECT_TRUE(o.status[r].ok())) ADD_FAILURE(where + ": " + o.status[r].message());
          size_t owned = 0;
          for (size_t first = 0; first < total; first += per_round) {
            size_t lo, hi;
            StagedAllreduce::Slice(std::min(per_round, total - first), sizeof(int64_t), r, size,
                                   &lo, &hi);
            for (size_t i = first + lo; i < first + hi; ++i) owned += i / kPiece % 3 != 2;
          }
          if (!EXPECT_EQ(o.packed[r] + owned, total)) ADD_FAILURE(where);
          for (size_t i = 0; i < total; ++i) {
            if (!EXPECT_EQ(o.results[r][i], Expected(i, size, op, 2)) ||
                !EXPECT_EQ(o.unpacked[r][i], 1)) {
              ADD_FAILURE(where + " rank " + std::to_string(r) + " element " + std::to_string(i));
              break;
            }
          }
        }
      }
    }
  }
}

SO_TEST(BackToBackRunsReuseTheAreasSafely) {
  // Rounds alternate areas without a third Sync: repeated runs with jittered ranks must not
  // see a later round's data in an earlier one. 100 elements take Note [One-Sync allreduce].
  for (int size : {2, 3, 4}) {
    Outcome small = RunRanks(size, size_t(1) << 20, 100, ReduceOp::kSum, 50);
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(small.status[r].ok());
      for (size_t i = 0; i < 100; ++i) {
        if (!EXPECT_EQ(small.results[r][i], Expected(i, size, ReduceOp::kSum, 49))) break;
      }
    }
    Outcome o = RunRanks(size, 256, 3000, ReduceOp::kSum, 50);
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(o.status[r].ok());
      for (size_t i = 0; i < 3000; ++i) {
        if (!EXPECT_EQ(o.results[r][i], Expected(i, size, ReduceOp::kSum, 49))) {
          ADD_FAILURE("size " + std::to_string(size) + " rank " + std::to_string(r) + " element " +
                      std::to_string(i));
          break;
        }
      }
    }
  }
}

// Note [One-Sync allreduce]: with an OutputFn a small run reduces the areas straight into the
// output (in place here: the output is the input), applies the postscale there, and unpacks
// nothing; a lone rank, or a run too large for one Sync, unpacks as before.
SO_TEST(SmallRunsReduceStraightIntoTheirOutput) {
  for (int size : {1, 2, 3, 4}) {
    for (size_t total : {size_t(1), size_t(100), size_t(1000)}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProduct}) {
        const double post = op == ReduceOp::kSum ? 0.25 : 1.0;
        SharedAreas shared(size, size_t(1) << 20, 0);
        std::vector<std::vector<int64_t>> results(size);
        std::vector<size_t> unpacked(size, 0);
        std::vector<Status> status(size);
        std::vector<std::thread> threads;
        for (int g = 0; g < size; ++g) {
          threads.emplace_back([&, g] {
            SharedAreas::View view(&shared, g);
            StagedAllreduce staged(&view);
            std::vector<int64_t>& data = results[g];
            data.resize(total);
            for (int rep = 0; rep < 20 && status[g].ok(); ++rep) {
              for (size_t i = 0; i < total; ++i)
                data[i] = static_cast<int64_t>(i % 11) * (g + 1) + rep;
              auto pack = [&](size_t first, size_t count, uint8_t* dst) {
                std::memcpy(dst, data.data() + first, count * sizeof(int64_t));
              };
              auto unpack = [&](size_t first, size_t count, const uint8_t* src) {
                const auto* v = reinterpret_cast<const int64_t*>(src);
                for (size_t i = 0; i < count; ++i)
                  data[first + i] = static_cast<int64_t>(static_cast<double>(v[i]) * post);
                unpacked[g] += count;
              };
              auto output = [&](size_t first, size_t, double* factor) {
                *factor = post;
                return reinterpret_cast<uint8_t*>(data.data() + first);
              };
              status[g] = staged.Run(total, DataType::kInt64, op, pack, unpack, HalfFactors(),
                                     nullptr, output);
            }
          });
        }
        for (std::thread& t : threads) t.join();
        const std::string where = "size " + std::to_string(size) + " total " +
                                  std::to_string(total) + " op " +
                                  std::to_string(static_cast<int>(op));
        const bool one_sync = size > 1 && total * sizeof(int64_t) * (size - 1) <= (16 << 10);
        for (int g = 0; g < size; ++g) {
          if (!EXPECT_TRUE(status[g].ok())) ADD_FAILURE(where);
          if (!EXPECT_EQ(unpacked[g], one_sync ? size_t(0) : 20 * total)) ADD_FAILURE(where);
          for (size_t i = 0; i < total; ++i) {
            const auto expected =
                static_cast<int64_t>(static_cast<double>(Expected(i, size, op, 19)) * post);
            if (!EXPECT_EQ(results[g][i], expected)) {
              ADD_FAILURE(where + " rank " + std::to_string(g) + " element " + std::to_string(i));
              break;
            }
          }
        }
      }
    }
  }
}

// Note [Hierarchical allreduce]
SO_TEST(HierarchicalRunsReduceOverEveryMachineOnceEach) {
  for (int machines : {2, 3}) {
    for (int size : {1, 2, 3, 4}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProduct}) {
        for (size_t total : {size_t(1), size_t(77), size_t(3000)}) {
          const int ranks = machines * size;
          // Max without Spans, the others with (Note [Staged allreduce]).
          Outcome o = RunRanks(size, 512, total, op, 3, 0, machines, 1, op != ReduceOp::kMax);
          for (int g = 0; g < ranks; ++g) {
            ASSERT_TRUE(o.status[g].ok());
            for (size_t i = 0; i < total; ++i) {
              if (!EXPECT_EQ(o.results[g][i], Expected(i, ranks, op, 2)) ||
                  !EXPECT_EQ(o.unpacked[g][i], 1)) {
                ADD_FAILURE(std::to_string(machines) + " machines x " + std::to_string(size) +
                            " ranks, rank " + std::to_string(g) + " element " + std::to_string(i) +
                            " of " + std::to_string(total));
                break;
              }
            }
          }
        }
      }
    }
  }
}

SO_TEST(HierarchicalRunsSplitLargeSlicesAcrossEndpointServers) {
  // A 4 MiB area: each rank's slice is large enough to be split across the servers' cross
  // transports (Note [Endpoint servers]); the results must not change.
  for (int servers : {2, 3}) {
    for (int machines : {2, 3}) {
      const size_t total = 600000;
      Outcome o = RunRanks(2, size_t(4) << 20, total, ReduceOp::kSum, 2, 0, machines, servers);
      for (int g = 0; g < 2 * machines; ++g) {
        ASSERT_TRUE(o.status[g].ok());
        for (size_t i = 0; i < total; ++i) {
          if (!EXPECT_EQ(o.results[g][i], Expected(i, 2 * machines, ReduceOp::kSum, 1))) {
            ADD_FAILURE(std::to_string(servers) + " servers, " + std::to_string(machines) +
                        " machines, rank " + std::to_string(g) + " element " + std::to_string(i));
            break;
          }
        }
      }
    }
  }
}

// Machines of different sizes (leader-based, Note [Hierarchical allreduce]): sizes[m] ranks on
// machine m, ranks numbered machine by machine; each machine's first rank crosses.
Outcome RunUneven(const std::vector<int>& sizes, size_t area_bytes, size_t total, ReduceOp op,
                  int repeats, bool with_input) {
  const int machines = static_cast<int>(sizes.size());
  std::vector<std::unique_ptr<SharedAreas>> shared;
  std::vector<int> first_rank;
  int ranks = 0;
  for (int m = 0; m < machines; ++m) {
    shared.push_back(std::make_unique<SharedAreas>(sizes[m], area_bytes));
    first_rank.push_back(ranks);
    ranks += sizes[m];
  }
  CrossGroup leaders(machines);
  Outcome out;
  out.results.assign(ranks, std::vector<int64_t>(total, -999));
  out.unpacked.assign(ranks, std::vector<int>(total, 0));
  out.status.resize(ranks);
  out.packed.assign(ranks, 0);
  std::vector<std::thread> threads;
  for (int m = 0; m < machines; ++m) {
    for (int r = 0; r < sizes[m]; ++r) {
      const int g = first_rank[m] + r;
      threads.emplace_back([&, m, r, g] {
        SharedAreas::View view(shared[m].get(), r);
        CrossGroup::Member member(&leaders, m);
        MachineReduce across({&member}, nullptr);
        StagedAllreduce staged(&view, r == 0 ? &across : nullptr, /*leader_based=*/true);
        RunRepetitions(staged, g, total, op, repeats, with_input, &out);
      });
    }
  }
  for (std::thread& t : threads) t.join();
  return out;
}

SO_TEST(LeaderBasedRunsServeMachinesOfDifferentSizes) {
  for (const std::vector<int>& sizes : {std::vector<int>{2, 1}, std::vector<int>{1, 3},
                                        std::vector<int>{3, 2, 1}, std::vector<int>{4, 2}}) {
    int ranks = 0;
    for (int n : sizes) ranks += n;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin}) {
      for (size_t total : {size_t(1), size_t(100), size_t(3000)}) {
        Outcome o = RunUneven(sizes, 512, total, op, 3, /*with_input=*/op == ReduceOp::kSum);
        for (int g = 0; g < ranks; ++g) {
          ASSERT_TRUE(o.status[g].ok());
          for (size_t i = 0; i < total; ++i) {
            if (!EXPECT_EQ(o.results[g][i], Expected(i, ranks, op, 2)) ||
                !EXPECT_EQ(o.unpacked[g][i], 1)) {
              ADD_FAILURE("machines of " + std::to_string(sizes[0]) + ", " +
                          std::to_string(sizes[1]) + ", ... ranks: rank " + std::to_string(g) +
                          " element " + std::to_string(i) + " of " + std::to_string(total));
              break;
            }
          }
        }
      }
    }
  }
}

SO_TEST(AFailedSyncEndsTheRunWithItsStatus) {
  for (uint64_t fail_at : {1, 2, 5}) {
    Outcome o = RunRanks(3, 512, 2000, ReduceOp::kSum, 1, fail_at);
    for (int r = 0; r < 3; ++r) {
      EXPECT_FALSE(o.status[r].ok());
      EXPECT_EQ(o.status[r].message(), "sync " + std::to_string(fail_at) + " failed");
    }
  }
}

// Note [Streaming stores]: a class's first kWarmRuns (not counted) and the next take ordinary
// stores, the one after streaming ones; then the faster kind, and every kProbeEvery-th the other.
SO_TEST(StoreChooserTimesBothKindsThenTakesTheFasterAndProbes) {
  StoreChooser c;
  for (int i = 0; i < StoreChooser::kWarmRuns; ++i) {
    EXPECT_EQ(c.Next(), false);
    c.Record(false, 1000, 1.0);  // first touches: not counted, or ordinary would never be taken
  }
  EXPECT_EQ(c.Next(), false);
  c.Record(false, 1000, 4e-3);  // ordinary: 4 ns a byte (the slow state)
  EXPECT_EQ(c.Next(), true);
  c.Record(true, 1000, 1e-3);
  int streamed = 0, probes = 0;
  for (uint64_t n = 0; n < 4 * StoreChooser::kProbeEvery; ++n) {
    const bool s = c.Next();
    streamed += s;
    probes += !s;
    c.Record(s, 1000, s ? 1e-3 : 4e-3);
  }
  EXPECT_EQ(probes, 4);
  EXPECT_EQ(streamed, static_cast<int>(4 * StoreChooser::kProbeEvery) - 4);
  c.Record(false, 0, 1.0);  // nothing moved: nothing learned
}

// Only recorded runs count (a called-off lane round records none), so every rank's chooser of
// one-Sync allreduces, which all make the same exchanges, probes at the same ones.
SO_TEST(StoreChooserCountsRecordedRunsOnly) {
  StoreChooser c;
  for (int i = 0; i < StoreChooser::kWarmRuns; ++i) c.Record(c.Next(), 1000, 1.0);
  c.Record(c.Next(), 1000, 4e-3);
  EXPECT_EQ(c.Next(), true);  // the streamed run, asked for again and again until recorded
  EXPECT_EQ(c.Next(), true);
  c.Record(true, 1000, 1e-3);
  int probes = 0;
  for (uint64_t n = 0; n < 2 * StoreChooser::kProbeEvery; ++n) {
    const bool s = c.Next();
    EXPECT_EQ(c.Next(), s);  // not recorded: the same run
    probes += !s;
    c.Record(s, 1000, s ? 1e-3 : 4e-3);
  }
  EXPECT_EQ(probes, 2);
}

// A kind's estimate is the least of its last kKept times: one run slowed by something else does
// not switch kinds, a change of state does, within kKept runs of the kind in use.
SO_TEST(StoreChooserIgnoresOneSlowRunAndFollowsAChangeOfState) {
  StoreChooser c;
  for (int i = 0; i < StoreChooser::kWarmRuns; ++i) c.Record(c.Next(), 1000, 1.0);
  c.Record(c.Next(), 1000, 1e-3);  // ordinary: 1 ns a byte (the fast state)
  c.Record(c.Next(), 1000, 2e-3);  // streamed: 2 ns
  EXPECT_EQ(c.Next(), false);
  c.Record(false, 1000, 9e-3);  // preempted once
  EXPECT_EQ(c.Next(), false);
  c.Record(false, 1000, 1e-3);
  // The state changes: ordinary stores take 4 ns a byte from now on, streaming ones 1.5.
  int ordinary_after = 0;
  for (int n = 0; n < 2 * static_cast<int>(StoreChooser::kProbeEvery); ++n) {
    const bool s = c.Next();
    if (!s) ++ordinary_after;
    c.Record(s, 1000, s ? 1.5e-3 : 4e-3);
  }
  // Ordinary until its last kKept runs are all slow, then streaming but for a probe or two.
  EXPECT_TRUE(ordinary_after >= StoreChooser::kKept - 1);
  EXPECT_TRUE(ordinary_after <= StoreChooser::kKept + 2);
  // And back: ordinary stores fast again, seen at the next probe.
  int streamed_late = 0;
  for (int n = 0; n < 2 * static_cast<int>(StoreChooser::kProbeEvery); ++n) {
    const bool s = c.Next();
    if (s && n >= static_cast<int>(StoreChooser::kProbeEvery)) ++streamed_late;
    c.Record(s, 1000, s ? 1.5e-3 : 1e-3);
  }
  EXPECT_EQ(streamed_late, 1);
}

}  // namespace
}  // namespace scaleout
