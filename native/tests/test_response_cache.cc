// Note [Response cache] through the negotiation protocol: slots on the second step, shapes that
// change, a full or disabled cache, slots arriving out of order, joined ranks.
#include "tests/negotiation_cluster.h"

namespace scaleout {
namespace {

using namespace negotiation_test;

// ---------------------------------------------------------------------------------------------
// Response cache

SO_TEST(NegotiationCacheSendsSlotsOnTheSecondStepAndMessagesShrink) {
  for (int n : kWorldSizes) {
    Cluster c(n, Immediate());
    const std::vector<Request> step = ModelStep(24);
    c.SubmitShuffled(step, 1);
    c.Settle();
    const auto first = c.TakeAll();
    ExpectSameEverywhere(first);
    EXPECT_TRUE(Answered(first[0]) == NamesOf(step));
    std::vector<uint64_t> bytes_first;
    for (int r = 0; r < n; ++r) bytes_first.push_back(c.net().bytes_sent(r));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(c.at(r).cache().size(), 24);  // every rank learned every slot
      if (r == 0) continue;
      EXPECT_EQ(c.at(r).stats().requests_sent_full, 24);
      EXPECT_EQ(c.at(r).stats().requests_sent_cached, 0);
    }

    for (int s = 2; s <= 3; ++s) {
      c.net().ResetCounters();
      c.SubmitShuffled(step, 1);
      c.Settle();
      const auto again = c.TakeAll();
      ExpectSameEverywhere(again);
      EXPECT_TRUE(Answered(again[0]) == NamesOf(step));
      for (int r = 1; r < n; ++r) {
        EXPECT_EQ(c.at(r).stats().requests_sent_full, 24);
        EXPECT_EQ(c.at(r).stats().requests_sent_cached, 24 * (s - 1));
        EXPECT_EQ(c.at(r).stats().messages_sent, s);  // one request message per step
        EXPECT_TRUE(c.net().bytes_sent(r) * 10 < bytes_first[r]);
      }
      // Rank 0's responses name the tensors by slot as well.
      EXPECT_TRUE(c.net().bytes_sent(0) * 3 < bytes_first[0]);
    }
  }
}

SO_TEST(NegotiationChangedShapeForACachedNameGoesInFull) {
  for (int n : kWorldSizes) {
    Cluster c(n, Immediate());
    std::vector<Request> step = ModelStep(8);
    c.SubmitShuffled(step, 2);
    c.Settle();
    c.TakeAll();
    step[3].shape = {32};  // every rank changes it
    c.SubmitShuffled(step, 2);
    c.Settle();
    auto got = c.TakeAll();
    ExpectSameEverywhere(got);
    EXPECT_TRUE(Answered(got[0]) == NamesOf(step));
    for (const Response& r : got[0]) {
      for (const ResponseTensor& t : r.tensors) {
        if (t.name == step[3].name) EXPECT_TRUE(t.shape == std::vector<int64_t>{32});
      }
    }
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(c.at(r).stats().requests_sent_full, 9);
      EXPECT_EQ(c.at(r).stats().requests_sent_cached, 7);
    }
    c.SubmitShuffled(step, 3);  // the new shape is what is cached now
    c.Settle();
    got = c.TakeAll();
    ExpectSameEverywhere(got);
    EXPECT_TRUE(Answered(got[0]) == NamesOf(step));
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(c.at(r).stats().requests_sent_full, 9);
      EXPECT_EQ(c.at(r).stats().requests_sent_cached, 15);
    }
  }
}

SO_TEST(NegotiationShapeChangedOnOneRankOfACachedNameIsAMismatchAndRecovers) {
  for (int n : kWorldSizes) {
    for (int odd_one : {0, n - 1}) {
      Cluster c(n, Immediate());
      const std::vector<Request> step = ModelStep(6);
      c.SubmitShuffled(step, 4);
      c.Settle();
      c.TakeAll();
      for (int r = 0; r < n; ++r) {
        for (Request q : step) {
          if (r == odd_one && q.name == step[2].name) q.shape = {15};
          c.Submit(r, q);
        }
      }
      c.Settle();
      auto got = c.TakeAll();
      ExpectSameEverywhere(got);
      int errors = 0;
      for (const Response& r : got[0]) {
        if (!r.is_error()) continue;
        ++errors;
        EXPECT_EQ(Names(r), std::vector<std::string>{step[2].name});
        EXPECT_CONTAINS(r.error_message, "rank " + std::to_string(odd_one) + " has [15]");
      }
      EXPECT_EQ(errors, 1);
      EXPECT_EQ(Answered(got[0]).size(), 5);
      c.SubmitShuffled(step, 4);
      c.Settle();
      got = c.TakeAll();
      ExpectSameEverywhere(got);
      EXPECT_TRUE(Answered(got[0]) == NamesOf(step));
    }
  }
}

SO_TEST(NegotiationCacheCapacityZeroCachesNothingAndStillWorks) {
  for (int n : kWorldSizes) {
    Config config = Immediate();
    config.cache_capacity = 0;
    Cluster c(n, config);
    const std::vector<Request> step = ModelStep(10);
    std::vector<uint64_t> bytes_first;
    for (int s = 1; s <= 3; ++s) {
      c.net().ResetCounters();
      c.SubmitShuffled(step, 5);
      c.Settle();
      const auto got = c.TakeAll();
      ExpectSameEverywhere(got);
      EXPECT_TRUE(Answered(got[0]) == NamesOf(step));
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(c.at(r).cache().size(), 0);
        if (s == 1) bytes_first.push_back(c.net().bytes_sent(r));
        EXPECT_EQ(c.net().bytes_sent(r), bytes_first[r]);
        if (r == 0) continue;
        EXPECT_EQ(c.at(r).stats().requests_sent_full, 10 * s);
        EXPECT_EQ(c.at(r).stats().requests_sent_cached, 0);
      }
    }
  }
}

SO_TEST(NegotiationFullCacheSendsTheRestInFull) {
  for (int n : kWorldSizes) {
    Config config = Immediate();
    config.cache_capacity = 4;
    Cluster c(n, config);
    const std::vector<Request> step = ModelStep(10);
    for (int s = 1; s <= 3; ++s) {
      c.SubmitShuffled(step, 6);
      c.Settle();
      const auto got = c.TakeAll();
      ExpectSameEverywhere(got);
      EXPECT_TRUE(Answered(got[0]) == NamesOf(step));
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(c.at(r).cache().size(), 4);
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(c.at(r).stats().requests_sent_cached, 8);
      EXPECT_EQ(c.at(r).stats().requests_sent_full, 22);
    }
  }
}

SO_TEST(NegotiationCacheSlotsArrivingOutOfOrderAreRecorded) {
  for (int n : kWorldSizes) {
    Cluster c(n, Immediate());
    // Alternating dtypes: slots are given in ready order (0, 1, 2, ...), but fusion sends the
    // float32 group (0, 2, 4, ...) before the float64 group (1, 3, 5, ...).
    std::vector<Request> step;
    for (int i = 0; i < 8; ++i) {
      step.push_back(i % 2 ? Make("d" + std::to_string(i), SO_ALLREDUCE, {8}, DataType::kFloat64)
                           : Make("f" + std::to_string(i)));
    }
    for (const Request& r : step) c.SubmitEverywhere(r);
    c.Settle();
    auto got = c.TakeAll();
    ExpectSameEverywhere(got);
    ASSERT_EQ(got[1].size(), 2);
    std::vector<int32_t> slots;
    for (const Response& r : got[1]) {
      for (const ResponseTensor& t : r.tensors) {
        EXPECT_TRUE(t.assigns_slot);
        slots.push_back(t.cache_slot);
      }
    }
    EXPECT_TRUE(slots == (std::vector<int32_t>{0, 2, 4, 6, 1, 3, 5, 7}));
    for (int r = 1; r < n; ++r) {
      ASSERT_EQ(c.at(r).cache().size(), 8);
      for (int s = 0; s < 8; ++s) EXPECT_EQ(c.at(r).cache().NameOf(s), c.at(0).cache().NameOf(s));
    }
    // Next step: everything by slot, and every name comes back right.
    for (const Request& r : step) c.SubmitEverywhere(r);
    c.Settle();
    auto again = c.TakeAll();
    ExpectSameEverywhere(again);
    EXPECT_EQ(Transcript(again[1]), Transcript(got[0]));
    for (int r = 1; r < n; ++r) EXPECT_EQ(c.at(r).stats().requests_sent_cached, 8);
  }
}

SO_TEST(NegotiationCachedNameWithAJoinedRankCarriesTheShape) {
  for (int n : kWorldSizes) {
    const int k = n - 1;
    Cluster c(n, Immediate());
    c.SubmitEverywhere(Make("g", SO_ALLREDUCE, {6}));
    c.Settle();
    c.TakeAll();
    c.at(k).SubmitJoin();
    c.Settle();
    for (int r = 0; r < k; ++r) c.Submit(r, Make("g", SO_ALLREDUCE, {6}));
    c.Settle();
    const auto got = c.TakeAll();
    ExpectSameEverywhere(got);
    ASSERT_EQ(got[k].size(), 1);
    EXPECT_EQ(got[k][0].tensors[0].name, "g");
    EXPECT_TRUE(got[k][0].tensors[0].shape == std::vector<int64_t>{6});
    for (int r = 1; r < k; ++r) EXPECT_EQ(c.at(r).stats().requests_sent_cached, 1);
  }
}

}  // namespace
}  // namespace scaleout
