// Fusion of what becomes ready together (Note [Tensor fusion]), Note [Dispatch]: holding ready
// work back while more is arriving, and Note [Priority]: rounds in priority order, through the
// negotiation protocol.
#include "tests/negotiation_cluster.h"

namespace scaleout {
namespace {

using namespace negotiation_test;

// ---------------------------------------------------------------------------------------------
// Fusion of what becomes ready together

// Every rank submits `step` (in its own order) before anyone polls, so it all becomes ready on
// the one poll where rank 0 reads the last worker's message.
std::vector<std::vector<Response>> RunTogether(int n, const Config& config,
                                               const std::vector<Request>& step) {
  Cluster c(n, config);
  c.SubmitShuffled(step, 9);
  c.Settle();
  auto got = c.TakeAll();
  ExpectSameEverywhere(got);
  EXPECT_TRUE(Answered(got[0]) == NamesOf(step));
  return got;
}

std::vector<Request> SmallAllreduces(int count, DataType dtype = DataType::kFloat32) {
  std::vector<Request> step;
  for (int i = 0; i < count; ++i) {
    step.push_back(Make("grad" + std::to_string(i), SO_ALLREDUCE, {256}, dtype));
  }
  return step;  // 1 KiB each in float32
}

SO_TEST(NegotiationSmallAllreducesReadyTogetherArriveAsOneResponse) {
  for (int n : kWorldSizes) {
    const auto got = RunTogether(n, Immediate(), SmallAllreduces(40));
    ASSERT_EQ(got[0].size(), 1);
    EXPECT_EQ(got[0][0].tensors.size(), 40);
  }
}

SO_TEST(NegotiationFusionThresholdLimitsTheResponseSize) {
  for (int n : kWorldSizes) {
    Config config = Immediate();
    config.fusion_threshold_bytes = 4096;  // exactly four tensors
    auto got = RunTogether(n, config, SmallAllreduces(40));
    ASSERT_EQ(got[0].size(), 10);
    for (const Response& r : got[0]) EXPECT_EQ(r.tensors.size(), 4);
    config.fusion_threshold_bytes = 3000;  // a third would not fit
    got = RunTogether(n, config, SmallAllreduces(40));
    ASSERT_EQ(got[0].size(), 20);
    for (const Response& r : got[0]) EXPECT_EQ(r.tensors.size(), 2);
  }
}

SO_TEST(NegotiationFusionIsPerDtypeAndZeroThresholdDisablesIt) {
  for (int n : kWorldSizes) {
    std::vector<Request> step = SmallAllreduces(20);
    for (Request& r : SmallAllreduces(20, DataType::kFloat64)) {
      r.name = "double_" + r.name;
      step.push_back(r);
    }
    auto got = RunTogether(n, Immediate(), step);
    ASSERT_EQ(got[0].size(), 2);
    EXPECT_NE(got[0][0].dtype, got[0][1].dtype);
    for (const Response& r : got[0]) {
      EXPECT_EQ(r.tensors.size(), 20);
      for (const ResponseTensor& t : r.tensors) {
        EXPECT_EQ(t.name.rfind("double_", 0) == 0, r.dtype == DataType::kFloat64);
      }
    }
    Config config = Immediate();
    config.fusion_threshold_bytes = 0;
    got = RunTogether(n, config, step);
    EXPECT_EQ(got[0].size(), 40);
  }
}

// ---------------------------------------------------------------------------------------------
// Note [Dispatch]: holding ready work back while more is arriving

SO_TEST(NegotiationCycleTimeHoldsReadyWorkWhileOthersAreHalfSubmitted) {
  for (int n : kWorldSizes) {
    Config config;
    config.cycle_time_ms = 5;
    // (1) time runs out: "a" goes alone.  (2) "b" completes in time: both go fused.
    for (bool b_arrives : {false, true}) {
      Cluster c(n, config);
      c.SubmitEverywhere(Make("a"));
      for (int r = 0; r < n - 1; ++r) c.Submit(r, Make("b"));
      c.Settle();
      EXPECT_EQ(c.history(0).size(), 0);
      EXPECT_TRUE(c.at(0).busy());
      c.now += 0.002;
      c.Settle();
      EXPECT_EQ(c.history(n - 1).size(), 0);
      if (b_arrives) {
        c.Submit(n - 1, Make("b"));
        c.Settle();
        for (int r = 0; r < n; ++r) EXPECT_EQ(Transcript(c.Take(r)), "allreduce float32 [a,b]");
        continue;
      }
      c.now += 0.0035;
      c.Settle();
      for (int r = 0; r < n; ++r) EXPECT_EQ(Transcript(c.Take(r)), "allreduce float32 [a]");
      EXPECT_FALSE(c.at(0).busy());
      c.Submit(n - 1, Make("b"));  // nothing half-submitted now: sent at once
      c.Settle();
      for (int r = 0; r < n; ++r) EXPECT_EQ(Transcript(c.Take(r)), "allreduce float32 [b]");
    }
  }
}

SO_TEST(NegotiationCycleTimeNeverHoldsALoneCollectiveOrAFullBuffer) {
  for (int n : kWorldSizes) {
    Config config;
    config.cycle_time_ms = 5;
    Cluster c(n, config);
    c.SubmitEverywhere(Make("lone"));
    c.Settle();
    EXPECT_EQ(Transcript(c.Take(n - 1)), "allreduce float32 [lone]");
    config.fusion_threshold_bytes = 64;  // "a" alone fills it
    Cluster d(n, config);
    d.SubmitEverywhere(Make("a", SO_ALLREDUCE, {16}));
    d.Submit(0, Make("b"));
    d.Settle();
    EXPECT_EQ(Transcript(d.Take(n - 1)), "allreduce float32 [a]");
  }
}

// ---------------------------------------------------------------------------------------------
// Priority

Request WithPriority(Request r, int32_t priority) {
  r.priority = priority;
  return r;
}

SO_TEST(NegotiationOrdersReadyWorkByTheHighestPriorityAnyRankGave) {
  for (int n : kWorldSizes) {
    Config config = Immediate();
    config.fusion_threshold_bytes = 0;  // one response per tensor, to see the order
    Cluster c(n, config);
    // Only the last rank ranks "x" first: the highest priority given counts.
    for (int r = 0; r < n; ++r) {
      c.Submit(r, Make("w"));
      c.Submit(r, WithPriority(Make("x"), r == n - 1 ? 5 : 0));
      c.Submit(r, WithPriority(Make("y"), 1));
    }
    c.Settle();
    const auto got = c.TakeAll();
    ExpectSameEverywhere(got);
    EXPECT_EQ(Transcript(got[0]),
              "allreduce float32 [x]; allreduce float32 [y]; allreduce "
              "float32 [w]");
  }
}

SO_TEST(NegotiationPriorityRoundsLetLaterHigherPriorityWorkGoAhead) {
  for (int n : kWorldSizes) {
    Config config = Immediate();
    config.priority_bytes = 1024;  // one tensor a round
    Cluster c(n, config);
    // Three 1 KiB tensors of three priorities become ready together: one goes per round.
    for (int p = 0; p < 3; ++p) {
      c.SubmitEverywhere(WithPriority(Make("low" + std::to_string(p), SO_ALLREDUCE, {256}), p));
    }
    while (c.history(0).empty()) ASSERT_TRUE(c.Round());
    const auto first = c.TakeAll();
    ExpectSameEverywhere(first);
    EXPECT_EQ(Transcript(first[0]), "allreduce float32 [low2]");
    // A higher priority one submitted now overtakes what the first round left behind.
    c.SubmitEverywhere(WithPriority(Make("high", SO_ALLREDUCE, {256}), 9));
    c.Settle();
    const auto rest = c.TakeAll();
    ExpectSameEverywhere(rest);
    const std::string order = Transcript(rest[0]);
    EXPECT_TRUE(order.find("[high]") < order.find("[low0]"));
    EXPECT_TRUE(order.find("[low1]") < order.find("[low0]"));
    EXPECT_EQ(rest[0].size(), 3);
  }
}

SO_TEST(NegotiationPartsOfALargeTensorGoOneARoundOnEveryRank) {
  for (int n : kWorldSizes) {
    Config config = Immediate();
    config.priority_bytes = 1024;
    Cluster c(n, config);
    c.SubmitEverywhere(WithPriority(Make("big", SO_ALLREDUCE, {1000}), 1));  // 4000 bytes
    c.Settle();
    const auto got = c.TakeAll();
    ExpectSameEverywhere(got);
    ASSERT_EQ(got[0].size(), 4);
    for (int r = 0; r < n; ++r) {
      int64_t next = 0;
      for (const Response& part : got[r]) {
        ASSERT_EQ(part.tensors.size(), 1);
        EXPECT_EQ(part.tensors[0].name, "big");  // restored from the slot where sent compactly
        EXPECT_EQ(part.tensors[0].part_first, next);
        next += part.tensors[0].part_count;
      }
      EXPECT_EQ(next, 1000);
    }
  }
}

SO_TEST(NegotiationWorkWithoutPrioritiesIsNotSplitIntoRounds) {
  for (int n : kWorldSizes) {
    Config config = Immediate();
    config.priority_bytes = 1024;
    const auto got = RunTogether(n, config, SmallAllreduces(8));  // 8 KiB, all priority 0
    ASSERT_EQ(got[0].size(), 1);
    EXPECT_EQ(got[0][0].tensors.size(), 8);
  }
}

}  // namespace
}  // namespace scaleout
