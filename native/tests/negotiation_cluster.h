// What the negotiation tests share: Controllers of simulated ranks over the in-memory
// FakeNetwork (Cluster), polled round-robin from one thread with a clock the test sets, and
// ways to make requests and read what each rank was told to execute. Included by
// test_negotiation.cc, test_response_cache.cc, test_dispatch.cc, test_stalls.cc and
// test_deadlock.cc.
#ifndef SCALEOUT_TESTS_NEGOTIATION_CLUSTER_H_
#define SCALEOUT_TESTS_NEGOTIATION_CLUSTER_H_

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
namespace negotiation_test {

using test::FakeNetwork;

inline constexpr int kWorldSizes[] = {2, 3, 4};

#define EXPECT_CONTAINS(text, part)                                                 \
  do {                                                                              \
    const std::string so_text_ = (text);                                            \
    const std::string so_part_ = (part);                                            \
    if (so_text_.find(so_part_) == std::string::npos) {                             \
      ADD_FAILURE("expected \"" + so_text_ + "\" to contain \"" + so_part_ + "\""); \
    }                                                                               \
  } while (0)

// No hold-back: ready work is dispatched on the poll that makes it ready.
inline Config Immediate() {
  Config c;
  c.cycle_time_ms = 0;
  return c;
}

inline Request Make(const std::string& name, int32_t collective = SO_ALLREDUCE,
                    std::vector<int64_t> shape = {16}, DataType dtype = DataType::kFloat32) {
  Request r;
  r.name = name;
  r.collective = collective;
  r.shape = std::move(shape);
  r.dtype = dtype;
  return r;
}

// Names long enough that sending them is what costs bytes, as parameter names in models do.
inline std::vector<Request> ModelStep(int count) {
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

inline std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

inline std::vector<std::string> Names(const Response& r) {
  std::vector<std::string> names;
  for (const ResponseTensor& t : r.tensors) names.push_back(t.name);
  return names;
}

// What a rank executes, in words that must be equal on every rank ("allreduce float32 [a,b]").
// Shapes are left out: a compactly sent cached tensor carries none to the other ranks.
inline std::string Describe(const Response& r) {
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

inline std::string Transcript(const std::vector<Response>& responses, bool successes_only = false) {
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
inline void ExpectSameEverywhere(const std::vector<std::vector<Response>>& by_rank) {
  for (size_t r = 1; r < by_rank.size(); ++r) {
    if (!EXPECT_EQ(Transcript(by_rank[r]), Transcript(by_rank[0]))) {
      ADD_FAILURE("rank " + std::to_string(r) + " differs from rank 0 (world size " +
                  std::to_string(by_rank.size()) + ")");
    }
  }
}

// The names answered successfully, each exactly once.
inline std::multiset<std::string> Answered(const std::vector<Response>& responses) {
  std::multiset<std::string> names;
  for (const Response& r : responses) {
    if (r.is_error()) continue;
    for (const ResponseTensor& t : r.tensors) names.insert(t.name);
  }
  return names;
}

inline std::multiset<std::string> NamesOf(const std::vector<Request>& step) {
  std::multiset<std::string> names;
  for (const Request& r : step) names.insert(r.name);
  return names;
}

}  // namespace negotiation_test
}  // namespace scaleout

#endif  // SCALEOUT_TESTS_NEGOTIATION_CLUSTER_H_
