// Note [Deadlock] through the negotiation protocol: every pending collective fails on every rank
// once every rank is blocked and the book does not change, and not before.
#include "tests/negotiation_cluster.h"

namespace scaleout {
namespace {

using namespace negotiation_test;

// Note [Deadlock]
SO_TEST(NegotiationDeadlockFailsEveryPendingCollectiveOnEveryRank) {
  for (int n : kWorldSizes) {
    Cluster c(n, Immediate());
    c.Submit(0, Make("grad.w"));
    for (int r = 1; r < n; ++r) c.Submit(r, Make("grad.W"));
    c.Settle();
    for (int r = 0; r < n - 1; ++r) ASSERT_TRUE(c.at(r).SetBlocked(true, c.now).ok());
    c.Settle();
    EXPECT_FALSE(c.at(0).DetectDeadlock(c.now + 5, 1.0));  // the last rank is not blocked
    ASSERT_TRUE(c.at(n - 1).SetBlocked(true, c.now).ok());
    c.Settle();
    EXPECT_FALSE(c.at(0).DetectDeadlock(c.now + 0.5, 1.0));  // not for long enough yet
    EXPECT_FALSE(c.at(1).DetectDeadlock(c.now + 5, 1.0));    // rank 0 decides
    ASSERT_TRUE(c.at(0).DetectDeadlock(c.now + 1.5, 1.0));
    c.Settle();
    const auto got = c.TakeAll();
    ExpectSameEverywhere(got);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(got[r].size(), 2);
      for (const Response& resp : got[r]) {
        EXPECT_EQ(resp.error_code, SO_ERR_DEADLOCK);
        EXPECT_CONTAINS(resp.error_message, "rank 0 waits for 'grad.w'; rank 1 waits for 'grad.W'");
        EXPECT_CONTAINS(resp.error_message, "'grad.w' submitted only by rank 0");
      }
    }
    // The book is empty again: the next collective runs as usual.
    EXPECT_FALSE(c.at(0).DetectDeadlock(c.now + 10, 1.0));
    for (int r = 0; r < n; ++r) ASSERT_TRUE(c.at(r).SetBlocked(false, c.now).ok());
    c.SubmitEverywhere(Make("next"));
    c.Settle();
    EXPECT_EQ(Transcript(c.Take(n - 1)), "allreduce float32 [next]");
  }
}

SO_TEST(NegotiationNoDeadlockWhileARankIsUnblockedOrTheBookChanges) {
  Cluster c(3, Immediate());
  c.Submit(0, Make("a"));
  c.Submit(1, Make("a"));
  c.Settle();
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(c.at(r).SetBlocked(true, c.now).ok());
  c.Settle();
  c.now += 0.9;
  c.Submit(2, Make("b"));  // the book changed: the clock restarts
  c.Settle();
  EXPECT_FALSE(c.at(0).DetectDeadlock(c.now + 0.5, 1.0));
  ASSERT_TRUE(c.at(2).SetBlocked(false, c.now).ok());  // about to execute or compute
  c.Settle();
  EXPECT_FALSE(c.at(0).DetectDeadlock(c.now + 5, 1.0));
}

}  // namespace
}  // namespace scaleout
