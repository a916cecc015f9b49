// Rank 0's book of requests: which named collectives each rank has submitted,
// when a name is ready (submitted, or joined, on every rank), and whether the ranks agree.
//
// Pure logic, no communication and no clock of its own: driven by the Controller, unit-tested
// with simulated ranks. Not thread-safe (owned by the coordinator thread).
#ifndef SCALEOUT_COORDINATOR_NEGOTIATOR_H_
#define SCALEOUT_COORDINATOR_NEGOTIATOR_H_

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/message.h"
#include "coordinator/response_cache.h"

namespace scaleout {

class Negotiator {
 public:
  // `job_ranks`: the job's rank of each of the `world_size` ranks (a process set's members;
  // empty: the same numbers), used wherever a message names ranks.
  Negotiator(int world_size, ResponseCache* cache, std::vector<int> job_ranks = {});

  // A rank's request, with full parameters (cached slots already resolved). `now` is seconds on
  // any monotonic clock, used only for stall reports.
  void Add(int rank, Request request, double now);
  // The rank ran out of data (join()); it contributes zeros until every rank has joined.
  void Join(int rank);
  // The rank shut down (or died: `why` then says so, Note [Liveness]): everything waiting for
  // it fails, now and later.
  void RankGone(int rank, const std::string& why = "");

  // Single-tensor responses that became ready, in the order they became ready (errors too).
  std::vector<Response> TakeReady();
  // Responses taken but not sent this round (Note [Priority]): ready again, ahead of the rest.
  void PutBack(std::vector<Response> responses);
  bool HasReady() const { return !ready_.empty(); }
  // Some collective has been submitted by some ranks but not yet by all.
  bool HasPartial() const { return !table_.empty(); }
  const std::vector<Response>& ready() const { return ready_; }

  // Note [Deadlock]
  // A rank reports itself blocked when its user threads have all been waiting on scaleout
  // handles for a while, without using the CPU or submitting anything (the Coordinator decides
  // that, Coordinator::SampleBlocked). When every rank has been blocked for `hold` seconds and
  // the book has not changed meanwhile, none of the collectives in it can ever complete: each
  // fails on every rank with SO_ERR_DEADLOCK and one message naming, per rank, what it waits
  // for, and which ranks submitted each name. The book is then empty and later collectives run
  // as usual. Returns whether it happened.
  void SetBlocked(int rank, bool blocked, double now);
  bool DetectDeadlock(double now, double hold);

  // Collectives waiting longer than `threshold` seconds and not reported before: one line each,
  // naming the ranks that have and have not submitted them.
  std::vector<std::string> StallReport(double now, double threshold);
  // Collectives waiting at least `threshold` seconds (0: all), oldest first: one phrase each,
  // naming the ranks that have not submitted them. Empty if there are none.
  std::vector<std::string> Stalled(double now, double threshold) const;

 private:
  struct Entry {
    std::vector<std::optional<Request>> by_rank;
    int submitted = 0;
    double first_seen = 0;
    uint64_t arrival = 0;  // order of first arrival among all names
    bool stall_reported = false;
  };

  static const Request* FirstRequest(const Entry& e);  // nullptr if nobody submitted
  void CheckAllPending();
  bool IsReady(const Entry& e) const;
  void CheckReady(const std::string& name);
  void TakeIfReady(std::unordered_map<std::string, Entry>::iterator it);
  void FailJoin();
  std::string GoneList(const std::vector<int>& gone) const;
  std::vector<int32_t> Culprits() const;
  Response Build(const std::string& name, Entry& e);
  std::string Validate(const std::string& name, const Entry& e, int* code) const;

  std::vector<int> Named(std::vector<int> ranks) const;  // the job's ranks of these

  int size_;
  ResponseCache* cache_;
  std::vector<int> job_ranks_;
  std::unordered_map<std::string, Entry> table_;
  std::vector<Response> ready_;
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  std::vector<bool> gone_;
  int gone_count_ = 0;  // ranks in gone_
  std::vector<std::string> gone_why_;
  uint64_t arrival_counter_ = 0;
  std::vector<bool> blocked_;
  double blocked_since_ = -1;  // since when every rank is blocked, or -1
  double last_change_ = 0;     // when the book last changed
};

}  // namespace scaleout

#endif  // SCALEOUT_COORDINATOR_NEGOTIATOR_H_
