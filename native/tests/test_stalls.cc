// Stall reports (Note [Stalls]), a process set's negotiator naming the job's ranks (Note
// [Process sets]) and Note [Stall shutdown], through the negotiation protocol.
#include "tests/negotiation_cluster.h"

namespace scaleout {
namespace {

using namespace negotiation_test;

// ---------------------------------------------------------------------------------------------
// Stall reports

SO_TEST(NegotiatorStallReportNamesMissingRanksOnce) {
  ResponseCache cache(16, 4);
  Negotiator negotiator(4, &cache);
  negotiator.Add(0, Make("slow"), 100.0);
  negotiator.Add(2, Make("slow"), 101.0);
  negotiator.Join(3);
  EXPECT_EQ(negotiator.StallReport(150.0, 60.0).size(), 0);
  negotiator.Add(1, Make("later", SO_BROADCAST), 150.0);
  auto lines = negotiator.StallReport(161.0, 60.0);
  ASSERT_EQ(lines.size(), 1);
  EXPECT_CONTAINS(lines[0], "allreduce 'slow' has waited 61 s");
  EXPECT_CONTAINS(lines[0], "submitted by ranks 0, 2, 3");  // a joined rank counts as submitted
  EXPECT_CONTAINS(lines[0], "still missing on rank 1");
  EXPECT_EQ(negotiator.StallReport(300.0, 60.0).size(), 1);  // only "later" now
  EXPECT_EQ(negotiator.StallReport(900.0, 60.0).size(), 0);
  EXPECT_EQ(negotiator.StallReport(900.0, 0.0).size(), 0);  // 0 disables
  EXPECT_FALSE(negotiator.HasReady());
  EXPECT_THROW(negotiator.Add(0, Make("slow"), 900.0), InternalError);  // same name twice
}

// Note [Process sets]: a set's negotiator counts its own ranks, and names the job's.
SO_TEST(NegotiatorOfAProcessSetNamesTheJobsRanks) {
  ResponseCache cache(16, 3);
  Negotiator negotiator(3, &cache, {1, 3, 5});
  negotiator.Add(0, Make("slow"), 100.0);
  negotiator.Add(2, Make("slow"), 100.0);
  auto lines = negotiator.StallReport(200.0, 60.0);
  ASSERT_EQ(lines.size(), 1);
  EXPECT_CONTAINS(lines[0], "submitted by ranks 1, 5, still missing on rank 3");
  negotiator.Add(1, Make("slow", SO_ALLREDUCE, {8}), 200.0);
  auto ready = negotiator.TakeReady();
  ASSERT_EQ(ready.size(), 1);
  EXPECT_CONTAINS(ready[0].error_message, "ranks 1, 5 have [16]; rank 3 has [8]");
  Request root_a = Make("b", SO_BROADCAST), root_b = Make("b", SO_BROADCAST);
  root_a.root = 0;
  root_b.root = 2;
  negotiator.Add(0, root_a, 300.0);
  negotiator.Add(1, root_a, 300.0);
  negotiator.Add(2, root_b, 300.0);
  ready = negotiator.TakeReady();
  ASSERT_EQ(ready.size(), 1);
  EXPECT_CONTAINS(ready[0].error_message, "ranks 1, 3 have 1; rank 5 has 5");
  // Note [Error details]: culprits are the job's ranks too
  negotiator.RankGone(1);
  negotiator.Add(0, Make("after"), 400.0);
  ready = negotiator.TakeReady();
  ASSERT_EQ(ready.size(), 1);
  EXPECT_EQ(ready[0].error_code, SO_ERR_SHUT_DOWN);
  EXPECT_TRUE(ready[0].culprit_ranks == std::vector<int32_t>{3});
}

// A rank's request that arrives after a departed rank's error for that name was sent (the late
// rank had not submitted it then; rank 0, whose own request failed, never submits it again)
// fails at once: waiting for the ranks before the departed one hung it (tests/mp/lifecycle.py
// at 3 ranks, one run in 20 under load).
SO_TEST(NegotiationLateRequestAfterADepartureFailsWhateverRanksAreMissing) {
  for (int n : kWorldSizes) {
    if (n < 3) continue;
    ResponseCache cache(16, n);
    Negotiator negotiator(n, &cache);
    negotiator.Add(0, Make("orphan"), 1.0);
    negotiator.RankGone(1);
    auto ready = negotiator.TakeReady();
    ASSERT_EQ(ready.size(), 1);
    EXPECT_EQ(ready[0].error_code, SO_ERR_SHUT_DOWN);
    negotiator.Add(n - 1, Make("orphan"), 2.0);  // rank 0 and rank 1 missing
    ready = negotiator.TakeReady();
    ASSERT_EQ(ready.size(), 1);
    EXPECT_EQ(ready[0].error_code, SO_ERR_SHUT_DOWN);
    EXPECT_CONTAINS(ready[0].error_message, "rank 1 has shut down");
    EXPECT_EQ(negotiator.StallReport(100.0, 10).size(), 0);
  }
}

SO_TEST(NegotiationStallReportOnlyOnRankZero) {
  for (int n : kWorldSizes) {
    Cluster c(n, Immediate());
    for (int r = 0; r < n - 1; ++r) c.Submit(r, Make("stuck"));
    c.Settle();
    EXPECT_EQ(c.at(0).StallReport(c.now + 5, 10).size(), 0);
    auto lines = c.at(0).StallReport(c.now + 11, 10);
    ASSERT_EQ(lines.size(), 1);
    EXPECT_CONTAINS(lines[0], "'stuck'");
    EXPECT_CONTAINS(lines[0], "still missing on rank " + std::to_string(n - 1));
    EXPECT_EQ(c.at(0).StallReport(c.now + 30, 10).size(), 0);
    EXPECT_EQ(c.at(1).StallReport(c.now + 30, 10).size(), 0);
  }
}

// Note [Stall shutdown]
SO_TEST(NegotiationStallShutdownReachesEveryRankWithOneReason) {
  for (int n : kWorldSizes) {
    Cluster c(n, Immediate());
    std::vector<int> all_but_last;
    for (int r = 0; r < n - 1; ++r) all_but_last.push_back(r);
    c.SubmitOn(all_but_last, Make("stuck"));
    c.Submit(n - 1, Make("elsewhere", SO_BROADCAST));
    c.Settle();
    EXPECT_FALSE(c.at(0).StallShutdown(c.now + 5, 10));
    EXPECT_FALSE(c.at(1).StallShutdown(c.now + 50, 10));  // rank 0 decides
    EXPECT_FALSE(c.at(0).halted());
    ASSERT_TRUE(c.at(0).StallShutdown(c.now + 11, 10));
    c.Settle();
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(c.at(r).shutdown_complete());
      ASSERT_TRUE(c.at(r).halted());
      EXPECT_EQ(c.at(r).halt_status().code(), SO_ERR_SHUT_DOWN);
      const std::string& msg = c.at(r).halt_status().message();
      EXPECT_CONTAINS(msg,
                      "allreduce 'stuck' (waited 11 s for rank " + std::to_string(n - 1) + ")");
      EXPECT_CONTAINS(msg,
                      "broadcast 'elsewhere' (waited 11 s for " + RankList(all_but_last) + ")");
      EXPECT_CONTAINS(msg, "SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS=10 s");
      EXPECT_EQ(c.history(r).size(), 0);  // nothing was executed
    }
    EXPECT_EQ(c.net().in_flight(), 0);  // nothing stale for a later init()
    EXPECT_FALSE(c.at(0).StallShutdown(c.now + 100, 10));
    // Shutting down afterwards sends nothing more.
    const uint64_t sent = c.net().total_messages_sent();
    for (int r = 1; r < n; ++r) c.at(r).BeginShutdown();
    c.Settle();
    EXPECT_EQ(c.net().total_messages_sent(), sent);
  }
}

SO_TEST(NegotiationStallShutdownNamesAHorovodVariableItCameFrom) {
  Config config = Immediate();
  config.sources["SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS"] = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS";
  Cluster c(2, config);
  c.Submit(1, Make("late"));
  c.Settle();
  ASSERT_TRUE(c.at(0).StallShutdown(c.now + 3, 2));
  c.Settle();
  EXPECT_CONTAINS(c.at(1).halt_status().message(), "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=2 s");
  EXPECT_CONTAINS(c.at(1).halt_status().message(), "'late' (waited 3 s for rank 0)");
}

}  // namespace
}  // namespace scaleout
