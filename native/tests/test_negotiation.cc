// The negotiation protocol (Note [Negotiation]) end to end in one process: one Controller per
// simulated rank over the in-memory FakeNetwork, polled round-robin from one thread, with a
// clock the test sets. Covers agreement on order, readiness, mismatch errors, join, the response
// cache (Note [Response cache]), fusion of ready work, Note [Dispatch], shutdown and stall
// reports, each at several world sizes.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"
#include "coordinator/controller.h"
#include "coordinator/message.h"
#include "coordinator/negotiator.h"
#include "coordinator/response_cache.h"
#include "tests/fake_channel.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

using test::FakeNetwork;

constexpr int kWorldSizes[] = {2, 3, 4};

#define EXPECT_CONTAINS(text, part)                                                           \
  do {                                                                                        \
    const std::string so_text_ = (text);                                                      \
    const std::string so_part_ = (part);                                                      \
    if (so_text_.find(so_part_) == std::string::npos) {                                       \
      ADD_FAILURE("expected \"" + so_text_ + "\" to contain \"" + so_part_ + "\"");           \
    }                                                                                         \
  } while (0)

// No hold-back: ready work is dispatched on the poll that makes it ready.
Config Immediate() {
  Config c;
  c.cycle_time_ms = 0;
  return c;
}

Request Make(const std::string& name, int32_t collective = SO_ALLREDUCE,
             std::vector<int64_t> shape = {16}, DataType dtype = DataType::kFloat32) {
  Request r;
  r.name = name;
  r.collective = collective;
  r.shape = std::move(shape);
  r.dtype = dtype;
  return r;
}

// Names long enough that sending them is what costs bytes, as parameter names in models do.
std::vector<Request> ModelStep(int count) {
  std::vector<Request> step;
  for (int i = 0; i < count; ++i) {
    step.push_back(Make("model/encoder/block_" + std::to_string(i) + "/attention/weight_grad"));
  }
  return step;
}

// A deterministic permutation per seed (SplitMix64 driving Fisher-Yates).
template <typename T>
std::vector<T> Shuffled(std::vector<T> v, uint64_t seed) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = v.size(); i > 1; --i) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::swap(v[i - 1], v[z % i]);
  }
  return v;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::vector<std::string> Names(const Response& r) {
  std::vector<std::string> names;
  for (const ResponseTensor& t : r.tensors) names.push_back(t.name);
  return names;
}

// What a rank executes, in words that must be equal on every rank ("allreduce float32 [a,b]").
// Shapes are left out: a compactly sent cached tensor carries none to the other ranks.
std::string Describe(const Response& r) {
  if (r.collective == SO_JOIN && !r.is_error()) {
    return "join(last=" + std::to_string(r.last_joined_rank) + ")";
  }
  std::string s = r.is_error() ? "error" + std::to_string(r.error_code) + " " : "";
  s += std::string(CollectiveName(r.collective)) + " " + DataTypeName(r.dtype) + " [";
  for (size_t i = 0; i < r.tensors.size(); ++i) s += (i ? "," : "") + r.tensors[i].name;
  s += "]";
  if (!r.joined_ranks.empty()) {
    s += " joined{";
    for (size_t i = 0; i < r.joined_ranks.size(); ++i) {
      s += (i ? "," : "") + std::to_string(r.joined_ranks[i]);
    }
    s += "}";
  }
  return s;
}

std::string Transcript(const std::vector<Response>& responses, bool successes_only = false) {
  std::string s;
  for (const Response& r : responses) {
    if (successes_only && r.is_error()) continue;
    s += (s.empty() ? "" : "; ") + Describe(r);
  }
  return s;
}

// N Controllers over one FakeNetwork, and what each rank was told to execute.
class Cluster {
 public:
  Cluster(int size, const Config& config) : net_(size), history_(size), unread_(size, 0) {
    for (int r = 0; r < size; ++r) {
      controllers_.push_back(std::make_unique<Controller>(net_.channel(r), config));
    }
  }

  int size() const { return net_.size(); }
  Controller& at(int rank) { return *controllers_.at(rank); }
  FakeNetwork& net() { return net_; }
  double now = 1000.0;

  void Submit(int rank, const Request& r) { at(rank).Submit(r, now); }
  void SubmitOn(const std::vector<int>& ranks, const Request& r) {
    for (int rank : ranks) Submit(rank, r);
  }
  void SubmitEverywhere(const Request& r) {
    for (int rank = 0; rank < size(); ++rank) Submit(rank, r);
  }
  // Every rank submits all of `step`, each in its own order.
  void SubmitShuffled(const std::vector<Request>& step, uint64_t seed) {
    for (int rank = 0; rank < size(); ++rank) {
      const uint64_t rank_seed = seed * 131 + static_cast<uint64_t>(rank);
      for (const Request& r : Shuffled(step, rank_seed)) Submit(rank, r);
    }
  }

  // Polls each rank once, rank 0 first; true if anything was sent, received or handed out.
  bool Round() {
    const uint64_t sent = net_.total_messages_sent();
    const size_t queued = net_.in_flight();
    bool moved = false;
    for (int r = 0; r < size(); ++r) {
      std::vector<Response> out;
      Status s = at(r).Poll(now, &out);
      if (!s.ok()) {
        ADD_FAILURE("Poll on rank " + std::to_string(r) + " failed: " + s.message());
        poll_failed_ = true;
      }
      moved = moved || !out.empty();
      for (Response& resp : out) history_[r].push_back(std::move(resp));
    }
    return moved || net_.total_messages_sent() != sent || net_.in_flight() != queued;
  }

  // Polls until a whole round changes nothing: every message delivered and handed out. Work
  // that rank 0 holds back for fusion stays held (time does not pass unless the test moves it).
  void Settle() {
    for (int round = 0; round < 1000 && !poll_failed_; ++round) {
      if (!Round()) return;
    }
    if (!poll_failed_) ADD_FAILURE("the simulated ranks did not settle in 1000 rounds");
  }

  const std::vector<Response>& history(int rank) const { return history_.at(rank); }
  // Responses `rank` got since the last call.
  std::vector<Response> Take(int rank) {
    const auto& h = history_.at(rank);
    std::vector<Response> recent(h.begin() + static_cast<std::ptrdiff_t>(unread_[rank]), h.end());
    unread_[rank] = h.size();
    return recent;
  }
  std::vector<std::vector<Response>> TakeAll() {
    std::vector<std::vector<Response>> all;
    for (int r = 0; r < size(); ++r) all.push_back(Take(r));
    return all;
  }

 private:
  FakeNetwork net_;
  std::vector<std::unique_ptr<Controller>> controllers_;
  std::vector<std::vector<Response>> history_;
  std::vector<size_t> unread_;
  bool poll_failed_ = false;
};

// Every rank was told to execute the same list, in the same order.
void ExpectSameEverywhere(const std::vector<std::vector<Response>>& by_rank) {
  for (size_t r = 1; r < by_rank.size(); ++r) {
    if (!EXPECT_EQ(Transcript(by_rank[r]), Transcript(by_rank[0]))) {
      ADD_FAILURE("rank " + std::to_string(r) + " differs from rank 0 (world size " +
                  std::to_string(by_rank.size()) + ")");
    }
  }
}

// The names answered successfully, each exactly once.
std::multiset<std::string> Answered(const std::vector<Response>& responses) {
  std::multiset<std::string> names;
  for (const Response& r : responses) {
    if (r.is_error()) continue;
    for (const ResponseTensor& t : r.tensors) names.insert(t.name);
  }
  return names;
}

std::multiset<std::string> NamesOf(const std::vector<Request>& step) {
  std::multiset<std::string> names;
  for (const Request& r : step) names.insert(r.name);
  return names;
}

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
  const char* field;     // as the error message names it
  const char* value_a;   // how the message prints the even ranks' value
  const char* value_b;   // ... and the odd ranks'
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
    EXPECT_CONTAINS(got[0][1].error_message, "allgather 'b' cannot run while rank " +
                                                 std::to_string(n - 1) + " has joined");
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
      EXPECT_CONTAINS(got[r][2].error_message, "broadcast 'bc' cannot run while rank " +
                                                   std::to_string(k) + " has joined");
      EXPECT_CONTAINS(got[r][2].error_message, "not supported with join()");
      EXPECT_FALSE(got[r][3].is_error());  // a barrier can run
    }
  }
}

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
    for (int r = 0; r < k; ++r) {
      ASSERT_EQ(got[r].size(), 2);
      EXPECT_EQ(Transcript(got[r]), Transcript(got[0]));
      for (const Response& resp : got[r]) {
        EXPECT_EQ(resp.error_code, SO_ERR_SHUT_DOWN);
        EXPECT_CONTAINS(resp.error_message, "rank " + std::to_string(k) + " has shut down");
        // Note [Error details]: the culprit travels to every rank as data
        EXPECT_TRUE(resp.culprit_ranks == std::vector<int32_t>{k});
      }
      EXPECT_CONTAINS(got[r][0].error_message, "'pending'");
      EXPECT_CONTAINS(got[r][1].error_message, "'later'");
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
  EXPECT_EQ(negotiator.StallReport(900.0, 0.0).size(), 0);   // 0 disables
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
      EXPECT_CONTAINS(msg, "allreduce 'stuck' (waited 11 s for rank " + std::to_string(n - 1) + ")");
      EXPECT_CONTAINS(msg, "broadcast 'elsewhere' (waited 11 s for " + RankList(all_but_last) + ")");
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
      ASSERT_EQ(got.size(), 2);
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
