// float16 and bfloat16 through StagedAllreduce (Note [Halves on the wire]) over in-process
// machines whose ranks are threads: staged as 2-byte elements, prescaled once, rounded once per
// machine sum and once at the end with the post factor, the same bits on every rank; on one
// machine, on machines of the same size (with endpoint servers) and of different sizes.
#include <cstdint>
#include <cstring>
#include <memory>
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

float Widen(uint16_t h, DataType dtype) {
  float f;
  WidenToFloat(&f, &h, 1, dtype, 1.0);
  return f;
}
uint16_t Narrow(float f, DataType dtype, double factor) {
  uint16_t h;
  NarrowFromFloat(&h, &f, 1, dtype, factor);
  return h;
}

// Rank g's element i: a multiple of 1/64 in [-8, 8] rounded to the dtype, so that float32
// sums of up to 16 of them (times 0.5) are exact and only the roundings to the half type count.
uint16_t Input(int g, size_t i, DataType dtype) {
  const float v = static_cast<float>(static_cast<int>((i * 37 + g * 101) % 1025) - 512) / 64.0f;
  return Narrow(v, dtype, 1.0);
}

struct MachineLayout {
  std::vector<int> sizes;  // ranks per machine; ranks numbered machine by machine
  int servers = 1;
};

// Every rank's result of one allreduce of `total` elements.
std::vector<std::vector<uint16_t>> RunHalves(const MachineLayout& layout, DataType dtype,
                                             ReduceOp op, size_t total, size_t area,
                                             HalfFactors factors) {
  const int machines = static_cast<int>(layout.sizes.size());
  bool uniform = true;
  for (int n : layout.sizes) uniform = uniform && n == layout.sizes[0];
  std::vector<std::unique_ptr<SharedAreas>> shared;
  std::vector<int> machine_of, local_rank_of;
  for (int m = 0; m < machines; ++m) {
    shared.push_back(std::make_unique<SharedAreas>(layout.sizes[m], area));
    for (int r = 0; r < layout.sizes[m]; ++r) {
      machine_of.push_back(m);
      local_rank_of.push_back(r);
    }
  }
  const int ranks = static_cast<int>(machine_of.size());
  // Uniform: groups[r * servers + i] links local rank r's server i; else groups[0] the leaders.
  std::vector<std::unique_ptr<CrossGroup>> groups;
  for (int k = 0; k < (uniform ? layout.sizes[0] * layout.servers : 1); ++k) {
    groups.push_back(std::make_unique<CrossGroup>(machines));
  }
  std::vector<std::vector<uint16_t>> results(ranks, std::vector<uint16_t>(total, 0xdead));
  std::vector<std::thread> threads;
  for (int g = 0; g < ranks; ++g) {
    threads.emplace_back([&, g] {
      const int m = machine_of[g], r = local_rank_of[g];
      SharedAreas::View view(shared[m].get(), r);
      std::vector<std::unique_ptr<CrossGroup::Member>> members;
      std::vector<DataTransport*> cross;
      const int servers = uniform ? layout.servers : 1;
      for (int i = 0; i < servers; ++i) {
        members.push_back(
            std::make_unique<CrossGroup::Member>(groups[uniform ? r * servers + i : 0].get(), m));
        cross.push_back(members.back().get());
      }
      EndpointPool pool(servers, {});
      MachineReduce across(cross, &pool);
      MachineReduce* crossing = machines == 1 ? nullptr : uniform || r == 0 ? &across : nullptr;
      StagedAllreduce staged(&view, crossing, machines > 1 && !uniform);
      auto pack = [&](size_t first, size_t count, uint8_t* dst) {
        for (size_t i = 0; i < count; ++i) {
          const uint16_t h = Input(g, first + i, dtype);
          std::memcpy(dst + 2 * i, &h, 2);
        }
      };
      auto unpack = [&](size_t first, size_t count, const uint8_t* src) {
        std::memcpy(results[g].data() + first, src, 2 * count);
      };
      Status s = staged.Run(total, dtype, op, pack, unpack, factors);
      if (!s.ok()) results[g].assign(total, 0xbad);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// The documented arithmetic: each machine's sum of prescaled inputs rounded to the half type
// (only when there are machines to cross), the machines' sums added in float32, the result
// rounded once with the post factor.
uint16_t Expected(const MachineLayout& layout, size_t i, DataType dtype, ReduceOp op,
                  HalfFactors f) {
  auto combine = [&](float a, float b) {
    switch (op) {
      case ReduceOp::kMin:
        return a < b ? a : b;
      case ReduceOp::kMax:
        return a > b ? a : b;
      case ReduceOp::kProduct:
        return a * b;
      default:
        return a + b;
    }
  };
  const bool crossing = layout.sizes.size() > 1;
  float total = 0;
  int g = 0;
  for (size_t m = 0; m < layout.sizes.size(); ++m) {
    float machine = 0;
    for (int r = 0; r < layout.sizes[m]; ++r, ++g) {
      const float v = Widen(Input(g, i, dtype), dtype) * static_cast<float>(f.pre);
      machine = r == 0 ? v : combine(machine, v);
    }
    if (crossing) machine = Widen(Narrow(machine, dtype, 1.0), dtype);
    total = m == 0 ? machine : combine(total, machine);
  }
  return Narrow(total, dtype, f.post);
}

SO_TEST(HalvesAreReducedInFloat32AndRoundedOncePerStep) {
  const std::vector<MachineLayout> layouts = {{{2}},       {{3}},    {{4}},       {{1, 1}},
                                              {{2, 2}},    {{3, 3}}, {{2, 2, 2}}, {{2, 2}, 2},
                                              {{4, 4}, 3}, {{2, 1}}, {{1, 3}},    {{3, 2, 1}}};
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    for (const MachineLayout& layout : layouts) {
      int ranks = 0;
      for (int n : layout.sizes) ranks += n;
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        // Average's factors (1/ranks after, a prescale before) and plain Sum's.
        for (HalfFactors f : {HalfFactors{1.0, 1.0}, HalfFactors{0.5, 1.0 / ranks}}) {
          for (size_t area : {size_t(256), size_t(1) << 16}) {  // many rounds, and one
            const size_t total = 3001;
            auto got = RunHalves(layout, dtype, op, total, area, f);
            int wrong = 0;
            for (int g = 0; g < ranks && wrong < 3; ++g) {
              for (size_t i = 0; i < total && wrong < 3; ++i) {
                const uint16_t want = Expected(layout, i, dtype, op, f);
                if (!EXPECT_EQ(got[g][i], want)) {
                  ++wrong;
                  ADD_FAILURE(std::string(dtype == DataType::kFloat16 ? "float16" : "bfloat16") +
                              ", " + std::to_string(layout.sizes.size()) + " machines, " +
                              std::to_string(ranks) + " ranks, op " +
                              std::to_string(static_cast<int>(op)) + ", pre " +
                              std::to_string(f.pre) + ", area " + std::to_string(area) + ": rank " +
                              std::to_string(g) + " element " + std::to_string(i));
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace scaleout
