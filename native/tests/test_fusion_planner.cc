// PlanFusion and FusedBytes (Note [Tensor fusion]): what may be merged, up to how many bytes,
// and where the merged and the unmerged responses end up; TakeRound (Note [Priority]): the
// order of a round and what it leaves for the next.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/message.h"
#include "fusion/fusion_planner.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

// One negotiated single-tensor response, as the Negotiator makes them.
Response Ready(const std::string& name, std::vector<int64_t> shape,
               DataType dtype = DataType::kFloat32, int32_t collective = SO_ALLREDUCE) {
  Response r;
  r.collective = collective;
  r.dtype = dtype;
  ResponseTensor t;
  t.name = name;
  t.shape = std::move(shape);
  r.tensors.push_back(std::move(t));
  return r;
}

// 25 float32 elements: 100 bytes.
Response Small(const std::string& name) { return Ready(name, {25}); }

Response Gather(const std::string& name, std::vector<int64_t> shape,
                std::vector<int64_t> first_dims) {
  Response r = Ready(name, std::move(shape), DataType::kFloat32, SO_ALLGATHER);
  r.tensors[0].first_dims = std::move(first_dims);
  return r;
}

// "a,b|c" for responses [a, b] and [c].
std::string Layout(const std::vector<Response>& plan) {
  std::string s;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (i) s += "|";
    for (size_t j = 0; j < plan[i].tensors.size(); ++j) {
      s += (j ? "," : "") + plan[i].tensors[j].name;
    }
  }
  return s;
}

SO_TEST(FusionThresholdBoundaries) {
  const std::vector<Response> three = {Small("a"), Small("b"), Small("c")};
  EXPECT_EQ(Layout(PlanFusion(three, 1 << 20)), "a,b,c");
  EXPECT_EQ(Layout(PlanFusion(three, 300)), "a,b,c");  // exactly full
  EXPECT_EQ(Layout(PlanFusion(three, 299)), "a,b|c");
  EXPECT_EQ(Layout(PlanFusion(three, 200)), "a,b|c");
  EXPECT_EQ(Layout(PlanFusion(three, 199)), "a|b|c");
  EXPECT_EQ(Layout(PlanFusion(three, 100)), "a|b|c");
  // A tensor larger than the buffer still goes, alone, and does not hold the others back.
  EXPECT_EQ(Layout(PlanFusion({Small("a"), Ready("big", {1000}), Small("b"), Small("c")}, 200)),
            "a|big|b,c");
  EXPECT_EQ(Layout(PlanFusion(three, 99)), "a|b|c");
}

SO_TEST(FusionZeroThresholdChangesNothing) {
  std::vector<Response> ready;
  for (int i = 0; i < 5; ++i) ready.push_back(Small("t" + std::to_string(i)));
  const std::vector<Response> plan = PlanFusion(ready, 0);
  EXPECT_EQ(Layout(plan), "t0|t1|t2|t3|t4");
}

SO_TEST(FusionFillsGroupsInOrder) {
  std::vector<Response> ready;
  for (const char* n : {"a", "b", "c", "d", "e"}) ready.push_back(Small(n));
  EXPECT_EQ(Layout(PlanFusion(ready, 200)), "a,b|c,d|e");
  // Once a group is full, the next one starts, and later tensors join the newest group.
  EXPECT_EQ(Layout(PlanFusion({Ready("a", {50}), Ready("b", {50}), Small("c")}, 300)), "a|b,c");
}

SO_TEST(FusionCountsHalfTypesAsFourBytes) {
  for (DataType half : {DataType::kFloat16, DataType::kBFloat16}) {
    const Response r = Ready("h", {25}, half);
    EXPECT_EQ(FusedBytes(r, r.tensors[0]), 100);
    // 2 x 50 bytes as stored, but 2 x 100 bytes in the float32 fusion buffer.
    EXPECT_EQ(Layout(PlanFusion({Ready("x", {25}, half), Ready("y", {25}, half)}, 150)), "x|y");
    EXPECT_EQ(Layout(PlanFusion({Ready("x", {25}, half), Ready("y", {25}, half)}, 200)), "x,y");
  }
  const Response d = Ready("d", {25}, DataType::kFloat64);
  EXPECT_EQ(FusedBytes(d, d.tensors[0]), 200);
  const Response b = Ready("b", {25}, DataType::kInt8);
  EXPECT_EQ(FusedBytes(b, b.tensors[0]), 25);
  const Response scalar = Ready("s", {});
  EXPECT_EQ(FusedBytes(scalar, scalar.tensors[0]), 4);
  const Response multi = Ready("m", {2, 3, 4});
  EXPECT_EQ(FusedBytes(multi, multi.tensors[0]), 96);
}

SO_TEST(FusionCountsAllgatherBytesFromEveryRank) {
  // Rows of 3 float32 (12 bytes); 2 + 5 + 1 rows gathered.
  const Response g = Gather("g", {2, 3}, {2, 5, 1});
  EXPECT_EQ(FusedBytes(g, g.tensors[0]), 96);
  const Response h = Gather("h", {4, 3}, {4, 0, 0});
  EXPECT_EQ(FusedBytes(h, h.tensors[0]), 48);
  EXPECT_EQ(Layout(PlanFusion({g, h}, 144)), "g,h");
  EXPECT_EQ(Layout(PlanFusion({g, h}, 143)), "g|h");
  // The fused response keeps every tensor's rows.
  const std::vector<Response> plan = PlanFusion({g, h}, 1 << 20);
  ASSERT_EQ(plan.size(), 1);
  EXPECT_TRUE(plan[0].tensors[0].first_dims == (std::vector<int64_t>{2, 5, 1}));
  EXPECT_TRUE(plan[0].tensors[1].first_dims == (std::vector<int64_t>{4, 0, 0}));
  Response half = Gather("f", {1, 10}, {1, 1});
  half.dtype = DataType::kFloat16;
  EXPECT_EQ(FusedBytes(half, half.tensors[0]), 80);
}

SO_TEST(FusionKeepsErrorsAndOtherCollectivesInPlace) {
  Response error = Small("bad");
  error.error_code = SO_ERR_MISMATCH;
  error.error_message = "Mismatched shape";
  Response error2 = error;
  error2.tensors[0].name = "bad2";
  const std::vector<Response> ready = {Ready("bc", {25}, DataType::kFloat32, SO_BROADCAST),
                                       Small("a"),
                                       error,
                                       Ready("a2a", {25}, DataType::kFloat32, SO_ALLTOALL),
                                       Small("b"),
                                       Ready("rs", {25}, DataType::kFloat32, SO_REDUCESCATTER),
                                       error2,
                                       Ready("bar", {}, DataType::kFloat32, SO_BARRIER),
                                       Small("c"),
                                       Ready("bc2", {25}, DataType::kFloat32, SO_BROADCAST)};
  const std::vector<Response> plan = PlanFusion(ready, 1 << 20);
  // The fused allreduce takes the place of its first member, "a".
  EXPECT_EQ(Layout(plan), "bc|a,b,c|bad|a2a|rs|bad2|bar|bc2");
  ASSERT_EQ(plan.size(), 8);
  EXPECT_EQ(plan[2].error_code, SO_ERR_MISMATCH);
  EXPECT_EQ(plan[2].error_message, "Mismatched shape");
  EXPECT_EQ(plan[5].error_code, SO_ERR_MISMATCH);
  EXPECT_EQ(plan[3].collective, SO_ALLTOALL);
  // Two errors of the same kind are never merged either.
  EXPECT_EQ(Layout(PlanFusion({error, error2}, 1 << 20)), "bad|bad2");
}

SO_TEST(FusionNeverMergesDifferentKeys) {
  std::vector<Response> ready;
  ready.push_back(Small("base"));
  ready.push_back(Ready("f64", {25}, DataType::kFloat64));
  ready.push_back(Ready("gather", {25, 1}, DataType::kFloat32, SO_ALLGATHER));
  ready.back().tensors[0].first_dims = {25, 25};
  Response op = Small("max");
  op.reduce_op = ReduceOp::kMax;
  ready.push_back(op);
  Response pre = Small("pre");
  pre.prescale = 0.5;
  ready.push_back(pre);
  Response post = Small("post");
  post.postscale = 2.0;
  ready.push_back(post);
  Response joined = Small("joined");
  joined.joined_ranks = {1};
  ready.push_back(joined);
  Response joined2 = Small("joined2");
  joined2.joined_ranks = {2};
  ready.push_back(joined2);
  EXPECT_EQ(Layout(PlanFusion(ready, 1 << 20)), "base|f64|gather|max|pre|post|joined|joined2");

  // The same keys again join their own groups, each in its own place.
  std::vector<Response> twice = ready;
  for (Response r : ready) {
    r.tensors[0].name += "'";
    twice.push_back(r);
  }
  const std::vector<Response> plan = PlanFusion(twice, 1 << 20);
  EXPECT_EQ(Layout(plan),
            "base,base'|f64,f64'|gather,gather'|max,max'|pre,pre'|post,post'|joined,joined'|"
            "joined2,joined2'");
  ASSERT_EQ(plan.size(), 8);
  EXPECT_EQ(plan[1].dtype, DataType::kFloat64);
  EXPECT_EQ(plan[3].reduce_op, ReduceOp::kMax);
  EXPECT_EQ(plan[4].prescale, 0.5);
  EXPECT_EQ(plan[5].postscale, 2.0);
  EXPECT_TRUE(plan[6].joined_ranks == std::vector<int32_t>{1});
}

SO_TEST(FusionKeepsTensorCacheFields) {
  Response a = Small("a");
  a.tensors[0].cache_slot = 7;
  Response b = Small("b");
  b.tensors[0].cache_slot = 3;
  b.tensors[0].assigns_slot = true;
  const std::vector<Response> plan = PlanFusion({a, b}, 1 << 20);
  ASSERT_EQ(plan.size(), 1);
  ASSERT_EQ(plan[0].tensors.size(), 2);
  EXPECT_EQ(plan[0].tensors[0].cache_slot, 7);
  EXPECT_FALSE(plan[0].tensors[0].assigns_slot);
  EXPECT_EQ(plan[0].tensors[1].cache_slot, 3);
  EXPECT_TRUE(plan[0].tensors[1].assigns_slot);
  EXPECT_TRUE(plan[0].tensors[1].shape == std::vector<int64_t>{25});
  EXPECT_EQ(PlanFusion({}, 100).size(), 0);
}

Response Prioritized(const std::string& name, int32_t priority) {
  Response r = Small(name);
  r.priority = priority;
  return r;
}

SO_TEST(TakeRoundLeavesWorkWithoutPrioritiesAsItIs) {
  std::vector<Response> later = {Small("stale")};
  const std::vector<Response> plain = {Small("a"), Ready("big", {1000}), Small("c")};
  EXPECT_EQ(Layout(TakeRound(plain, 100, &later)), "a|big|c");  // no limit, nothing cut
  EXPECT_EQ(later.size(), 0);
  EXPECT_EQ(TakeRound({}, 100, &later).size(), 0);
}

SO_TEST(TakeRoundOrdersHighestFirstAndKeepsTiesInOrder) {
  std::vector<Response> later;
  const std::vector<Response> mixed = {Prioritized("a", 0),  Prioritized("b", 2),
                                       Prioritized("c", 0),  Prioritized("d", 2),
                                       Prioritized("e", -1), Prioritized("f", 1)};
  EXPECT_EQ(Layout(TakeRound(mixed, 0, &later)), "b|d|f|a|c|e");
  EXPECT_EQ(later.size(), 0);
  EXPECT_EQ(Layout(TakeRound(mixed, 300, &later)), "b|d|f");  // 100 bytes each: exactly full
  EXPECT_EQ(Layout(later), "a|c|e");
  EXPECT_EQ(Layout(TakeRound(mixed, 299, &later)), "b|d");
  EXPECT_EQ(Layout(later), "f|a|c|e");
  // One response goes even when it alone exceeds the limit (a broadcast is never cut).
  Response cast = Ready("cast", {25}, DataType::kFloat32, SO_BROADCAST);
  cast.priority = 5;
  EXPECT_EQ(Layout(TakeRound({Prioritized("a", 0), cast}, 1, &later)), "cast");
  EXPECT_EQ(later.size(), 25);  // a, in parts of one element
}

SO_TEST(TakeRoundCutsALargeAllreduceIntoPartsOfTheLimit) {
  std::vector<Response> later;
  Response big = Prioritized("big", 1);  // 1000 float32: 4000 bytes
  big.tensors[0].shape = {10, 100};
  big.tensors[0].cache_slot = 4;
  big.tensors[0].assigns_slot = true;
  // The smaller, more urgent one goes first; a whole part would not fit beside it.
  EXPECT_EQ(Layout(TakeRound({big, Prioritized("urgent", 2)}, 1024, &later)), "urgent");
  ASSERT_EQ(later.size(), 4);
  int64_t next = 0;
  for (size_t i = 0; i < later.size(); ++i) {
    const ResponseTensor& t = later[i].tensors[0];
    EXPECT_EQ(t.name, "big");
    EXPECT_TRUE(t.shape == std::vector<int64_t>({10, 100}));  // the whole tensor's
    EXPECT_EQ(t.part_first, next);
    EXPECT_EQ(t.part_count, i < 3 ? 256 : 232);
    EXPECT_EQ(t.cache_slot, 4);
    EXPECT_EQ(t.assigns_slot, i == 0);  // the first part tells the workers the slot
    EXPECT_EQ(FusedBytes(later[i], t), static_cast<size_t>(t.part_count) * 4);
    next += t.part_count;
  }
  // The parts go one round each, in order; parts are never cut again.
  std::vector<Response> rest;
  const std::vector<Response> round = TakeRound(later, 1024, &rest);
  ASSERT_EQ(round.size(), 1);
  EXPECT_EQ(round[0].tensors[0].part_first, 0);
  EXPECT_EQ(rest.size(), 3);
  // Halves count 4 bytes an element; Adasum, errors and no limit are not cut.
  Response half = Ready("half", {1000}, DataType::kFloat16);
  half.priority = 1;
  EXPECT_EQ(TakeRound({half}, 1024, &later)[0].tensors[0].part_count, 256);
  Response adasum = Prioritized("adasum", 1);
  adasum.tensors[0].shape = {1000};
  adasum.reduce_op = ReduceOp::kAdasum;
  EXPECT_FALSE(TakeRound({adasum}, 1024, &later)[0].tensors[0].is_part());
  EXPECT_FALSE(TakeRound({big}, 0, &later)[0].tensors[0].is_part());
}

SO_TEST(TakeRoundCountsFusedBytesAndNothingForErrors) {
  std::vector<Response> later;
  Response half = Ready("half", {25}, DataType::kFloat16);  // 100 bytes in the fusion buffer
  half.priority = 1;
  Response failed = Prioritized("failed", 2);
  failed.error_code = SO_ERR_INVALID_ARGUMENT;
  EXPECT_EQ(Layout(TakeRound({Prioritized("low", 0), half, failed}, 100, &later)), "failed|half");
  EXPECT_EQ(Layout(later), "low");
}

}  // namespace
}  // namespace scaleout
