// The negotiation protocol (Note [Negotiation]) end to end in one process (tests/
// negotiation_cluster.h): agreement on order and readiness, mismatch errors, join, shutdown and
// departed ranks, each at several world sizes. The response cache, dispatch and fusion, stalls
// and deadlocks have files of their own (test_response_cache.cc, test_dispatch.cc,
// test_stalls.cc, test_deadlock.cc).
#include "tests/negotiation_cluster.h"

namespace scaleout {
namespace {

using namespace negotiation_test;

// ---------------------------------------------------------------------------------------------
// Agreement on order and readiness

SO_TEST(NegotiationSameNamesInDifferentOrdersGiveTheSameListEverywhere) {
  for (int n : kWorldSizes) {
    Cluster c(n, Immediate());
    std::vector<Request> step;
    for (int i = 0; i < 24; ++i) {
      const int32_t kind = i % 3 == 0 ? SO_ALLGATHER : i % 3 == 1 ? SO_BROADCAST : SO_ALLREDUCE;
      step.push_back(Make("t" + std::to_string(i), kind, {4, 3},
                          i % 2 ? DataType::kFloat64 : DataType::kFloat32));
    }
    // Interleave submission and polling so that the names become ready in several batches.
    std::vector<std::vector<Request>> orders;
    for (int r = 0; r < n; ++r) orders.push_back(Shuffled(step, 7 + static_cast<uint64_t>(r)));
    for (size_t i = 0; i < step.size(); ++i) {
      for (int r = 0; r < n; ++r) c.Submit(r, orders[r][i]);
      if (i % 5 == 4) c.Round();
    }
    c.Settle();
    const auto got = c.TakeAll();
    ExpectSameEverywhere(got);
    EXPECT_TRUE(Answered(got[0]) == NamesOf(step));
    for (const Response& r : got[0]) EXPECT_FALSE(r.is_error());
  }
}

SO_TEST(NegotiationNameIsNotAnsweredUntilEveryRankSubmitsIt) {
  for (int n : kWorldSizes) {
    for (int last : {0, n - 1}) {  // the coordinator itself, or a worker, submits last
      Cluster c(n, Immediate());
      for (int r = 0; r < n; ++r) {
        if (r != last) c.Submit(r, Make("w"));
      }
      c.Submit(last, Make("other"));
      c.Settle();
      for (int r = 0; r < n; ++r) EXPECT_EQ(c.history(r).size(), 0);
      EXPECT_EQ(c.net().in_flight(), 0);
      c.Submit(last, Make("w"));
      c.Settle();
      const auto got = c.TakeAll();
      ExpectSameEverywhere(got);
      EXPECT_EQ(Transcript(got[0]), "allreduce float32 [w]");
      // "other" is still half-submitted.
      for (int r = 0; r < n; ++r) {
        if (r != last) c.Submit(r, Make("other"));
      }
      c.Settle();
      EXPECT_EQ(Transcript(c.Take(0)), "allreduce float32 [other]");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Mismatches: an error on every rank naming the tensor, the field and who disagrees

struct MismatchCase {
  const char* field;    // as the error message names it
  const char* value_a;  // how the message prints the even ranks' value
  const char* value_b;  // ... and the odd ranks'
  Request a, b;
};

std::vector<MismatchCase> MismatchCases() {
  std::vector<MismatchCase> cases;
  Request base = Make("t");
  Request other = base;
  other.shape = {8};
  cases.push_back({"Mismatched shape for allreduce 't'", "[16]", "[8]", base, other});
  other = base;
  other.dtype = DataType::kFloat64;
  cases.push_back({"Mismatched dtype for allreduce 't'", "float32", "float64", base, other});
  other = base;
  other.reduce_op = ReduceOp::kMax;
  cases.push_back({"Mismatched reduce op for allreduce 't'", "Sum", "Max", base, other});
  other = base;
  other.prescale = 0.5;
  cases.push_back({"Mismatched prescale factor for allreduce 't'", "1", "0.5", base, other});
  Request bcast = Make("t", SO_BROADCAST);
  other = bcast;
  other.root = 1;
  cases.push_back({"Mismatched root rank for broadcast 't'", "0", "1", bcast, other});
  other = base;
  other.collective = SO_ALLGATHER;
  cases.push_back(
      {"Mismatched operation for collective 't'", "allreduce", "allgather", base, other});
  Request gather = Make("t", SO_ALLGATHER, {5, 3});
  other = gather;
  other.shape = {2, 4};
  cases.push_back({"Mismatched shape after the first dimension for allgather 't'", "[3]", "[4]",
                   gather, other});
  return cases;
}

SO_TEST(NegotiationMismatchIsAnErrorEverywhereNamingTensorFieldAndRanks) {
  for (int n : kWorldSizes) {
    for (const MismatchCase& m : MismatchCases()) {
      Cluster c(n, Immediate());
      std::vector<int> even, odd;
      for (int r = 0; r < n; ++r) {
        (r % 2 ? odd : even).push_back(r);
        c.Submit(r, r % 2 ? m.b : m.a);
      }
      c.Settle();
      const auto got = c.TakeAll();
      ExpectSameEverywhere(got);
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(got[r].size(), 1);
        const Response& resp = got[r][0];
        EXPECT_EQ(resp.error_code, SO_ERR_MISMATCH);
        EXPECT_EQ(Names(resp), std::vector<std::string>{"t"});
        EXPECT_CONTAINS(resp.error_message, m.field);
        EXPECT_CONTAINS(resp.error_message,
                        RankList(even) + (even.size() == 1 ? " has " : " have ") + m.value_a);
        EXPECT_CONTAINS(resp.error_message,
                        RankList(odd) + (odd.size() == 1 ? " has " : " have ") + m.value_b);
      }
      // The name is free again, and agreeing ranks now succeed.
      c.SubmitEverywhere(m.a);
      c.Settle();
      EXPECT_EQ(Transcript(c.Take(n - 1)), Transcript(c.Take(0)));
      EXPECT_FALSE(c.history(0).back().is_error());
    }
  }
}

SO_TEST(NegotiationAllgatherFirstDimensionsMayDiffer) {
  for (int n : kWorldSizes) {
    Cluster c(n, Immediate());
    for (int r = 0; r < n; ++r) c.Submit(r, Make("g", SO_ALLGATHER, {r + 1, 3}));
    c.Settle();
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(c.history(r).size(), 1);
      const Response& resp = c.history(r)[0];
      EXPECT_FALSE(resp.is_error());
      std::vector<int64_t> want;
      for (int k = 0; k < n; ++k) want.push_back(k + 1);
      EXPECT_TRUE(resp.tensors[0].first_dims == want);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Join

SO_TEST(NegotiationJoinedRankIsNamedInResponsesAndJoinCompletesForEveryone) {
  for (int n : kWorldSizes) {
    for (int k : {0, 1, n - 1}) {
      Cluster c(n, Immediate());
      c.at(k).SubmitJoin();
      c.Settle();
      for (int r = 0; r < n; ++r) {
        if (r != k) c.Submit(r, Make("g"));
      }
      c.Settle();
      const auto got = c.TakeAll();
      ExpectSameEverywhere(got);
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(got[r].size(), 1);
        EXPECT_FALSE(got[r][0].is_error());
        EXPECT_TRUE(got[r][0].joined_ranks == std::vector<int32_t>{k});
        // The joined rank contributes zeros, so it needs the name and shape.
        EXPECT_EQ(got[r][0].tensors[0].name, "g");
        EXPECT_TRUE(got[r][0].tensors[0].shape == std::vector<int64_t>{16});
      }
      // The others join one after another; the last of them is reported to everyone.
      int last = -1;
      for (int r = 0; r < n; ++r) {
        if (r == k) continue;
        for (int q = 0; q < n; ++q) EXPECT_EQ(c.Take(q).size(), 0);
        c.at(r).SubmitJoin();
        c.Settle();
        last = r;
      }
      const auto joined = c.TakeAll();
      ExpectSameEverywhere(joined);
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(joined[r].size(), 1);
        EXPECT_EQ(joined[r][0].collective, SO_JOIN);
        EXPECT_EQ(joined[r][0].last_joined_rank, last);
      }
      // Joining is over: a collective needs every rank again.
      for (int r = 1; r < n; ++r) c.Submit(r, Make("after"));
      c.Settle();
      EXPECT_EQ(c.history(0).size(), 2);
      c.Submit(0, Make("after"));
      c.Settle();
      EXPECT_EQ(Transcript(c.Take(n - 1)), "allreduce float32 [after]");
    }
  }
}

SO_TEST(NegotiationJoinCompletesCollectivesWaitingOnlyForTheJoiningRank) {
  for (int n : kWorldSizes) {
    Cluster c(n, Immediate());
    for (int r = 0; r < n - 1; ++r) {
      c.Submit(r, Make("a"));
      c.Submit(r, Make("b", SO_ALLGATHER, {2, 2}));
    }
    c.Settle();
    EXPECT_EQ(c.history(0).size(), 0);
    c.at(n - 1).SubmitJoin();
    c.Settle();
    const auto got = c.TakeAll();
    ExpectSameEverywhere(got);
    // Both complete, in the order they first arrived: the allreduce with n-1 contributing
    // zeros, the allgather with Horovod's error (Note [Join]).
    const std::string joined = " joined{" + std::to_string(n - 1) + "}";
    ASSERT_EQ(got[0].size(), 2);
    EXPECT_EQ(Transcript({got[0][0]}), "allreduce float32 [a]" + joined);
    EXPECT_EQ(got[0][1].error_code, SO_ERR_INVALID_ARGUMENT);
    EXPECT_CONTAINS(got[0][1].error_message,
                    "allgather 'b' cannot run while rank " + std::to_string(n - 1) + " has joined");
    EXPECT_CONTAINS(got[0][1].error_message, "sparse_as_dense=True");
  }
}

SO_TEST(NegotiationCollectivesThatCannotRunWithAJoinedRankFail) {
  for (int n : kWorldSizes) {
    const int k = n - 1;
    Cluster c(n, Immediate());
    c.at(k).SubmitJoin();
    c.Settle();
    for (int r = 0; r < k; ++r) {
      c.Submit(r, Make("a2a", SO_ALLTOALL, {4}));
      c.Submit(r, Make("rs", SO_REDUCESCATTER, {8}));
      Request b = Make("bc", SO_BROADCAST);
      b.root = k;
      c.Submit(r, b);
      c.Submit(r, Make("ok", SO_BARRIER, {}));
    }
    c.Settle();
    const auto got = c.TakeAll();
    ExpectSameEverywhere(got);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(got[r].size(), 4);
      EXPECT_EQ(got[r][0].error_code, SO_ERR_INVALID_ARGUMENT);
      EXPECT_CONTAINS(got[r][0].error_message,
                      "alltoall 'a2a' cannot run while rank " + std::to_string(k) + " has joined");
      EXPECT_EQ(got[r][1].error_code, SO_ERR_INVALID_ARGUMENT);
      EXPECT_CONTAINS(got[r][1].error_message, "reducescatter 'rs'");
      EXPECT_EQ(got[r][2].error_code, SO_ERR_INVALID_ARGUMENT);
      EXPECT_CONTAINS(got[r][2].error_message,
                      "broadcast 'bc' cannot run while rank " + std::to_string(k) + " has joined");
      EXPECT_CONTAINS(got[r][2].error_message, "not supported with join()");
      EXPECT_FALSE(got[r][3].is_error());  // a barrier can run
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Shutdown

SO_TEST(NegotiationWorkerShutdownCompletesAfterAckAndFailsWhatNeededIt) {
  for (int n : {3, 4}) {
    const int k = n - 1;
    Cluster c(n, Immediate());
    for (int r = 0; r < k; ++r) c.Submit(r, Make("pending"));
    c.Settle();
    c.at(k).BeginShutdown();
    EXPECT_TRUE(c.at(k).busy());
    std::vector<Response> out;
    EXPECT_TRUE(c.at(k).Poll(c.now, &out).ok());
    EXPECT_FALSE(c.at(k).shutdown_complete());  // not before rank 0 answers
    c.Settle();
    EXPECT_TRUE(c.at(k).shutdown_complete());
    EXPECT_FALSE(c.at(k).rank_zero_gone());
    for (int r = 0; r < k; ++r) EXPECT_FALSE(c.at(r).shutdown_complete());
    for (int r = 0; r < k; ++r) c.Submit(r, Make("later"));
    c.Settle();
    const auto got = c.TakeAll();
    EXPECT_EQ(got[k].size(), 0);
    // 'pending' once, and 'later' once per rank's request: each fails as it arrives (the gone
    // rank never submits, and a rank whose request failed never submits that name again)
    for (int r = 0; r < k; ++r) {
      ASSERT_EQ(got[r].size(), 1 + k);
      EXPECT_EQ(Transcript(got[r]), Transcript(got[0]));
      for (const Response& resp : got[r]) {
        EXPECT_EQ(resp.error_code, SO_ERR_SHUT_DOWN);
        EXPECT_CONTAINS(resp.error_message, "rank " + std::to_string(k) + " has shut down");
        // Note [Error details]: the culprit travels to every rank as data
        EXPECT_TRUE(resp.culprit_ranks == std::vector<int32_t>{k});
      }
      EXPECT_CONTAINS(got[r][0].error_message, "'pending'");
      for (int i = 1; i <= k; ++i) EXPECT_CONTAINS(got[r][i].error_message, "'later'");
    }
    EXPECT_EQ(c.net().in_flight(), 0);
  }
}

// Every rank executes the same successful collectives: one that ran without a rank that was
// listed in it (neither submitted nor joined) would hang in the data plane.
void ExpectSameSuccesses(Cluster& c) {
  for (int r = 1; r < c.size(); ++r) {
    if (!EXPECT_EQ(Transcript(c.history(r), true), Transcript(c.history(0), true))) {
      ADD_FAILURE("rank " + std::to_string(r) + " and rank 0 executed different collectives");
    }
  }
}

SO_TEST(NegotiationWorkerShutdownFailsCollectivesItHadAlreadySubmitted) {
  for (int n : {3, 4}) {
    const int k = n - 1;
    Cluster c(n, Immediate());
    c.Submit(k, Make("x"));
    c.Submit(0, Make("x"));
    c.Settle();
    c.at(k).BeginShutdown();
    c.Settle();
    for (int r = 1; r < k; ++r) c.Submit(r, Make("x"));
    c.Settle();
    ExpectSameSuccesses(c);
    // Whether x fails at once or once every live rank has submitted it, it fails everywhere.
    for (int r = 0; r < k; ++r) {
      ASSERT_TRUE(!c.history(r).empty());
      for (const Response& resp : c.history(r)) {
        EXPECT_EQ(resp.error_code, SO_ERR_SHUT_DOWN);
        EXPECT_CONTAINS(resp.error_message, "rank " + std::to_string(k));
      }
    }
  }
}

SO_TEST(NegotiationWorkerShutdownRightAfterItsRequestStillLinesUp) {
  for (int n : kWorldSizes) {
    const int k = n - 1;
    Cluster c(n, Immediate());
    for (int r = 0; r < k; ++r) c.Submit(r, Make("x"));
    c.Settle();
    c.Submit(k, Make("x"));
    std::vector<Response> out;
    EXPECT_TRUE(c.at(k).Poll(c.now, &out).ok());  // sends x ...
    c.at(k).BeginShutdown();                      // ... and its shutdown right behind it
    c.Settle();
    EXPECT_TRUE(c.at(k).shutdown_complete());
    EXPECT_EQ(out.size(), 0);  // nothing could have come back yet
    ExpectSameSuccesses(c);
  }
}

SO_TEST(NegotiationWorkerShutdownFailsAPendingJoin) {
  for (int n : {3, 4}) {
    const int k = n - 1;
    Cluster c(n, Immediate());
    for (int r = 0; r < k; ++r) c.at(r).SubmitJoin();
    c.Settle();
    c.at(k).BeginShutdown();
    c.Settle();
    // The join can never complete: every rank still running must hear so.
    for (int r = 0; r < k; ++r) {
      ASSERT_EQ(c.history(r).size(), 1);
      EXPECT_EQ(c.history(r)[0].collective, SO_JOIN);
      EXPECT_EQ(c.history(r)[0].error_code, SO_ERR_SHUT_DOWN);
      EXPECT_CONTAINS(c.history(r)[0].error_message, "rank " + std::to_string(k));
    }
  }
}

SO_TEST(NegotiationRankZeroShutdownReachesEveryWorker) {
  for (int n : kWorldSizes) {
    for (bool worker_leaves_too : {false, true}) {
      Cluster c(n, Immediate());
      for (int r = 1; r < n; ++r) c.Submit(r, Make("never"));
      c.Settle();
      if (worker_leaves_too) c.at(1).BeginShutdown();  // crosses rank 0's kShutdown
      c.at(0).BeginShutdown();
      c.Settle();
      for (int r = 0; r < n; ++r) EXPECT_TRUE(c.at(r).shutdown_complete());
      for (int r = 1; r < n; ++r) {
        if (!worker_leaves_too || r != 1) EXPECT_TRUE(c.at(r).rank_zero_gone());
      }
      EXPECT_EQ(c.net().in_flight(), 0);  // nothing stale for a later init()
      for (int r = 0; r < n; ++r) EXPECT_EQ(c.history(r).size(), 0);
      for (int r = 1; r < n; ++r) {
        if (!worker_leaves_too || r != 1) {
          EXPECT_TRUE(c.at(r).halt_status().culprit_ranks() == std::vector<int32_t>{0});
        }
      }
    }
  }
}

SO_TEST(NegotiationRankZeroDoesNotWaitForWorkersThatLeft) {
  for (int n : kWorldSizes) {
    Cluster c(n, Immediate());
    c.at(n - 1).BeginShutdown();
    c.Settle();
    ASSERT_TRUE(c.at(n - 1).shutdown_complete());
    c.at(0).BeginShutdown();
    c.Settle();
    for (int r = 0; r < n; ++r) EXPECT_TRUE(c.at(r).shutdown_complete());
    EXPECT_EQ(c.net().in_flight(), 0);
    // A worker told that rank 0 left finishes its own shutdown without a word.
    if (n > 2) {
      const uint64_t sent = c.net().total_messages_sent();
      c.at(1).BeginShutdown();
      EXPECT_TRUE(c.at(1).shutdown_complete());
      EXPECT_EQ(c.net().total_messages_sent(), sent);
    }
  }
}

SO_TEST(NegotiationChannelErrorsSurfaceFromPoll) {
  Cluster c(2, Immediate());
  c.net().FailSendsFrom(1, true);
  c.Submit(1, Make("x"));
  std::vector<Response> out;
  Status s = c.at(1).Poll(c.now, &out);
  EXPECT_EQ(s.code(), SO_ERR_TRANSPORT);
}

// Note [Liveness]
SO_TEST(NegotiationADeadRankFailsWhatNeedsItNamingWhy) {
  for (int n : kWorldSizes) {
    if (n < 2) continue;
    const int dead = n - 1;
    Cluster c(n, Immediate());
    for (int r = 0; r < dead; ++r) c.Submit(r, Make("pending"));
    c.Settle();
    const std::string why = "rank " + std::to_string(dead) + " (pid 4242) died: its process exited";
    c.at(0).PeerDied(dead, why);
    c.at(0).PeerDied(dead, "again");  // once only
    for (int r = 0; r < dead; ++r) c.Submit(r, Make("later"));
    c.Settle();
    for (int r = 0; r < dead; ++r) {
      const auto got = c.Take(r);
      ASSERT_EQ(got.size(), 1 + dead);  // 'pending', then 'later' per survivor's request
      for (const Response& resp : got) {
        EXPECT_EQ(resp.error_code, SO_ERR_SHUT_DOWN);
        EXPECT_CONTAINS(resp.error_message, "cannot complete: " + why);
        EXPECT_TRUE(resp.culprit_ranks == std::vector<int32_t>{dead});
      }
    }
  }
}

}  // namespace
}  // namespace scaleout
