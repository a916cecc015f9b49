#include "coordinator/negotiator.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <utility>

namespace scaleout {
namespace {

std::string RankList(const std::vector<int>& ranks) {
  std::ostringstream s;
  s << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << ranks[i];
  return s.str();
}

// The job's rank of rank r (`job_ranks` empty: r itself).
int JobRank(const std::vector<int>& job_ranks, int r) {
  return job_ranks.empty() || r < 0 ? r : job_ranks[r];
}

// "field of 'name' differs: ranks 0, 2 have X; rank 1 has Y", grouping ranks by value.
template <typename Fn>
std::string Disagreement(const std::string& field, const std::string& name, const char* op,
                         const std::vector<std::optional<Request>>& by_rank,
                         const std::vector<int>& job_ranks, Fn value_of) {
  std::map<std::string, std::vector<int>> groups;
  std::vector<std::string> order;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    if (!by_rank[r]) continue;
    std::string v = value_of(*by_rank[r]);
    if (!groups.count(v)) order.push_back(v);
    groups[v].push_back(JobRank(job_ranks, static_cast<int>(r)));
  }
  if (groups.size() <= 1) return "";
  std::ostringstream s;
  s << "Mismatched " << field << " for " << op << " '" << name << "' across ranks: ";
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& ranks = groups[order[i]];
    s << (i ? "; " : "") << RankList(ranks) << (ranks.size() == 1 ? " has " : " have ") << order[i];
  }
  return s.str();
}

std::string Str(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The first field on which the ranks' requests differ, as a message naming the ranks.
std::string FieldMismatch(const std::string& name, const std::vector<std::optional<Request>>& br,
                          const Request& first, const std::vector<int>& jr) {
  const char* op = CollectiveName(first.collective);
  std::string msg = Disagreement("operation", name, "collective", br, jr, [](const Request& r) {
    return std::string(CollectiveName(r.collective));
  });
  if (msg.empty()) {
    msg = Disagreement("dtype", name, op, br, jr,
                       [](const Request& r) { return std::string(DataTypeName(r.dtype)); });
  }
  if (msg.empty() && (first.collective == SO_ALLGATHER || first.collective == SO_ALLTOALL)) {
    msg = Disagreement("number of dimensions", name, op, br, jr,
                       [](const Request& r) { return std::to_string(r.shape.size()); });
    if (msg.empty()) {
      msg = Disagreement("shape after the first dimension", name, op, br, jr, [](const Request& r) {
        return ShapeString(
            std::vector<int64_t>(r.shape.begin() + (r.shape.empty() ? 0 : 1), r.shape.end()));
      });
    }
  } else if (msg.empty()) {
    msg = Disagreement("shape", name, op, br, jr,
                       [](const Request& r) { return ShapeString(r.shape); });
  }
  if (msg.empty()) {
    msg = Disagreement("reduce op", name, op, br, jr,
                       [](const Request& r) { return std::string(ReduceOpName(r.reduce_op)); });
  }
  if (msg.empty())
    msg = Disagreement("prescale factor", name, op, br, jr,
                       [](const Request& r) { return Str(r.prescale); });
  if (msg.empty())
    msg = Disagreement("postscale factor", name, op, br, jr,
                       [](const Request& r) { return Str(r.postscale); });
  if (msg.empty()) {
    msg = Disagreement("root rank", name, op, br, jr,
                       [&jr](const Request& r) { return std::to_string(JobRank(jr, r.root)); });
  }
  return msg;
}

}  // namespace

Negotiator::Negotiator(int world_size, ResponseCache* cache, std::vector<int> job_ranks)
    : size_(world_size),
      cache_(cache),
      job_ranks_(std::move(job_ranks)),
      joined_(world_size, false),
      gone_(world_size, false),
      gone_why_(world_size),
      blocked_(world_size, false) {}

std::vector<int> Negotiator::Named(std::vector<int> ranks) const {
  for (int& r : ranks) r = JobRank(job_ranks_, r);
  return ranks;
}

void Negotiator::Add(int rank, Request request, double now) {
  SO_CHECK(rank >= 0 && rank < size_, "request from an unknown rank");
  // One lookup of the name for the whole of this (a small collective's negotiation is mostly
  // such bookkeeping); the name is copied only into a new entry.
  auto it = table_.try_emplace(request.name).first;
  Entry& e = it->second;
  if (e.by_rank.empty()) {
    e.by_rank.resize(size_);
    e.first_seen = now;
    e.arrival = arrival_counter_++;
  }
  SO_CHECK(!e.by_rank[rank],
           "rank " + std::to_string(rank) + " submitted '" + it->first + "' twice");
  e.by_rank[rank] = std::move(request);
  ++e.submitted;
  last_change_ = now;
  TakeIfReady(it);
}

// "rank 2 has shut down", or why a rank is gone when that is known (Note [Liveness]).
std::string Negotiator::GoneList(const std::vector<int>& gone) const {
  std::vector<int> plain;
  std::string out;
  for (int r : gone) {
    if (gone_why_[r].empty()) {
      plain.push_back(r);
    } else {
      out += (out.empty() ? "" : "; ") + gone_why_[r];
    }
  }
  if (!plain.empty()) {
    out += (out.empty() ? "" : "; ") + RankList(Named(plain)) +
           (plain.size() == 1 ? " has" : " have") + " shut down";
  }
  return out;
}

// Note [Error details]: every departed rank, as the job numbers it.
std::vector<int32_t> Negotiator::Culprits() const {
  std::vector<int> gone;
  for (int r = 0; r < size_; ++r) {
    if (gone_[r]) gone.push_back(r);
  }
  gone = Named(std::move(gone));
  return std::vector<int32_t>(gone.begin(), gone.end());
}

void Negotiator::Join(int rank) {
  if (joined_[rank]) return;
  joined_[rank] = true;
  ++joined_count_;
  last_joined_ = rank;
  if (gone_count_ > 0) {
    FailJoin();
    return;
  }
  CheckAllPending();
  if (joined_count_ == size_) {
    Response r;
    r.collective = SO_JOIN;
    r.last_joined_rank = last_joined_;
    ready_.push_back(std::move(r));
    std::fill(joined_.begin(), joined_.end(), false);
    joined_count_ = 0;
    last_joined_ = -1;
  }
}

// A join or a departed rank can make several pending collectives ready at once; they are taken
// in the order they first arrived, so the outcome does not depend on hash-map order.
void Negotiator::CheckAllPending() {
  std::vector<std::pair<uint64_t, std::string>> pending;
  for (const auto& kv : table_) pending.emplace_back(kv.second.arrival, kv.first);
  std::sort(pending.begin(), pending.end());
  for (const auto& p : pending) CheckReady(p.second);
}

const Request* Negotiator::FirstRequest(const Entry& e) {
  for (const auto& req : e.by_rank) {
    if (req) return &*req;
  }
  return nullptr;
}

void Negotiator::RankGone(int rank, const std::string& why) {
  if (gone_[rank]) return;
  gone_[rank] = true;
  ++gone_count_;
  gone_why_[rank] = why;
  CheckAllPending();
  if (joined_count_ > 0) FailJoin();
}

// Join waits for every rank; once one has shut down it can never complete.
void Negotiator::FailJoin() {
  std::vector<int> gone;
  for (int r = 0; r < size_; ++r) {
    if (gone_[r]) gone.push_back(r);
  }
  Response r;
  r.collective = SO_JOIN;
  r.error_code = SO_ERR_SHUT_DOWN;
  r.error_message = "join cannot complete: " + GoneList(gone);
  r.culprit_ranks = Culprits();
  ready_.push_back(std::move(r));
  std::fill(joined_.begin(), joined_.end(), false);
  joined_count_ = 0;
  last_joined_ = -1;
}

// A collective can never complete once a rank has shut down, even one that rank submitted before
// leaving (it will not execute it): it is ready at once, to fail - whichever ranks have not
// submitted it (a late request whose error was already sent to the others: rank 0 will not
// submit that name again, so waiting for it would hang the late rank).
bool Negotiator::IsReady(const Entry& e) const {
  if (gone_count_ > 0) return true;
  for (int r = 0; r < size_; ++r) {
    if (!e.by_rank[r] && !joined_[r]) return false;
  }
  return true;
}

void Negotiator::CheckReady(const std::string& name) {
  auto it = table_.find(name);
  if (it != table_.end()) TakeIfReady(it);
}

void Negotiator::TakeIfReady(std::unordered_map<std::string, Entry>::iterator it) {
  if (!IsReady(it->second)) return;
  ready_.push_back(Build(it->first, it->second));
  table_.erase(it);
}

std::string Negotiator::Validate(const std::string& name, const Entry& e, int* code) const {
  *code = SO_ERR_MISMATCH;
  std::vector<int> gone_missing;
  for (int r = 0; r < size_; ++r) {
    if (gone_[r]) gone_missing.push_back(r);
  }
  const Request* first = FirstRequest(e);
  const char* op = CollectiveName(first->collective);
  if (!gone_missing.empty()) {
    *code = SO_ERR_SHUT_DOWN;
    return std::string(op) + " '" + name + "' cannot complete: " + GoneList(gone_missing);
  }
  const auto& br = e.by_rank;
  bool agree = true;  // the common case, checked without formatting anything
  for (const auto& req : br) agree = agree && (!req || req->SameParams(*first));
  if (!agree) return FieldMismatch(name, br, *first, job_ranks_);
  // Note [Join]
  // Joined ranks stand in (with zeros) for allreduce and barrier only. Allgather,
  // broadcast, alltoall and reducescatter fail while a rank has joined, as in Horovod (whose
  // precondition error this is; its users' scripts expect it).
  std::vector<int> joined_missing;
  for (int r = 0; r < size_; ++r) {
    if (!br[r] && joined_[r]) joined_missing.push_back(r);
  }
  const int c = first->collective;
  if (!joined_missing.empty() && c != SO_ALLREDUCE && c != SO_BARRIER) {
    *code = SO_ERR_INVALID_ARGUMENT;
    std::string why =
        std::string(op) + " '" + name + "' cannot run while " + RankList(Named(joined_missing)) +
        (joined_missing.size() == 1 ? " has" : " have") + " joined: as in Horovod, " + op +
        " is not supported with join(); only "
        "allreduce and barrier can run until every rank has joined";
    if (c == SO_ALLGATHER) {
      why += " (a DistributedOptimizer with sparse gradients: pass sparse_as_dense=True)";
    }
    return why;
  }
  return "";
}

Response Negotiator::Build(const std::string& name, Entry& e) {
  const Request* first = FirstRequest(e);
  Response r;
  ResponseTensor t;
  t.name = name;
  if (first == nullptr) {  // only possible when every missing rank is gone or joined
    r.error_code = SO_ERR_SHUT_DOWN;
    r.error_message = "'" + name + "' cannot complete: ranks have shut down";
    r.culprit_ranks = Culprits();
    r.tensors.push_back(std::move(t));
    return r;
  }
  r.collective = first->collective;
  r.dtype = first->dtype;
  r.reduce_op = first->reduce_op;
  r.root = first->root;
  r.prescale = first->prescale;
  r.postscale = first->postscale;
  r.priority = first->priority;  // Note [Priority]: the highest any rank gave
  for (const std::optional<Request>& q : e.by_rank) {
    if (q && q->priority > r.priority) r.priority = q->priority;
  }
  t.shape = first->shape;
  int code = 0;
  std::string error = Validate(name, e, &code);
  for (int rk = 0; rk < size_; ++rk) {
    if (!e.by_rank[rk] && joined_[rk]) r.joined_ranks.push_back(rk);
  }
  if (!error.empty()) {
    r.error_code = code;
    r.error_message = error;
    if (code == SO_ERR_SHUT_DOWN) r.culprit_ranks = Culprits();
    r.tensors.push_back(std::move(t));
    return r;
  }
  if (r.collective == SO_ALLGATHER) {
    t.first_dims.resize(size_, 0);
    for (int rk = 0; rk < size_; ++rk) {
      if (e.by_rank[rk])
        t.first_dims[rk] = e.by_rank[rk]->shape.empty() ? 1 : e.by_rank[rk]->shape[0];
    }
  }
  if (ResponseCache::Cacheable(r.collective)) {
    int slot = cache_->Lookup(name);
    if (slot < 0) {
      slot = cache_->Assign(name);
      t.assigns_slot = slot >= 0;
    }
    t.cache_slot = slot;
    // Existing slots are kept current as full requests arrive (Controller::PollCoordinator).
    if (t.assigns_slot) {
      for (int rk = 0; rk < size_; ++rk) {
        if (e.by_rank[rk]) cache_->SetParams(slot, rk, *e.by_rank[rk]);
      }
    }
  }
  r.tensors.push_back(std::move(t));
  return r;
}

std::vector<Response> Negotiator::TakeReady() {
  std::vector<Response> out;
  out.swap(ready_);
  return out;
}

void Negotiator::PutBack(std::vector<Response> responses) {
  responses.insert(responses.end(), std::make_move_iterator(ready_.begin()),
                   std::make_move_iterator(ready_.end()));
  ready_.swap(responses);
}

std::vector<std::string> Negotiator::StallReport(double now, double threshold) {
  std::vector<std::string> lines;
  if (threshold <= 0) return lines;
  for (auto& kv : table_) {
    Entry& e = kv.second;
    if (e.stall_reported || now - e.first_seen < threshold) continue;
    e.stall_reported = true;
    std::vector<int> have, missing;
    for (int r = 0; r < size_; ++r) (e.by_rank[r] || joined_[r] ? have : missing).push_back(r);
    const Request* first = FirstRequest(e);
    std::ostringstream s;
    s << CollectiveName(first->collective) << " '" << kv.first << "' has waited "
      << static_cast<int>(now - e.first_seen) << " s: submitted by " << RankList(Named(have))
      << ", still missing on " << RankList(Named(missing))
      << " (a rank may be stuck, have skipped this collective, or use another name for it)";
    lines.push_back(s.str());
  }
  return lines;
}

void Negotiator::SetBlocked(int rank, bool blocked, double now) {
  SO_CHECK(rank >= 0 && rank < size_, "blocked state of an unknown rank");
  if (blocked_[rank] == blocked) return;
  blocked_[rank] = blocked;
  blocked_since_ = -1;
  if (!blocked) return;
  for (int r = 0; r < size_; ++r) {
    if (!blocked_[r] && !gone_[r]) return;
  }
  blocked_since_ = now;
}

bool Negotiator::DetectDeadlock(double now, double hold) {
  if (table_.empty() || blocked_since_ < 0) return false;
  if (now - std::max(blocked_since_, last_change_) < hold) return false;
  std::vector<std::pair<uint64_t, std::string>> names;
  for (const auto& kv : table_) names.emplace_back(kv.second.arrival, kv.first);
  std::sort(names.begin(), names.end());
  // Per rank: the names it submitted (it waits for them); per name: who submitted it.
  std::ostringstream msg;
  msg << "deadlock: every rank is waiting for collectives that no rank can complete: ";
  bool first_rank = true;
  for (int r = 0; r < size_; ++r) {
    std::vector<std::string> mine;
    for (const auto& n : names) {
      if (table_.at(n.second).by_rank[r]) mine.push_back("'" + n.second + "'");
    }
    if (mine.empty()) continue;
    msg << (first_rank ? "" : "; ") << "rank " << JobRank(job_ranks_, r) << " waits for ";
    for (size_t i = 0; i < mine.size(); ++i) {
      if (i == 8) {
        msg << " and " << (mine.size() - 8) << " more";
        break;
      }
      msg << (i ? ", " : "") << mine[i];
    }
    first_rank = false;
  }
  msg << " (";
  size_t shown = 0;
  for (const auto& n : names) {
    if (shown == 8) {
      msg << "; ...";
      break;
    }
    const Entry& e = table_.at(n.second);
    std::vector<int> have;
    for (int r = 0; r < size_; ++r) {
      if (e.by_rank[r]) have.push_back(r);
    }
    msg << (shown ? "; " : "") << "'" << n.second << "' submitted only by "
        << RankList(Named(have));
    ++shown;
  }
  msg << "). A name that differs between ranks, a collective skipped on some ranks, or "
         "collectives submitted in different orders by blocking calls";
  const std::string message = msg.str();
  for (const auto& n : names) {
    Entry& e = table_.at(n.second);
    const Request* first = FirstRequest(e);
    Response r;
    r.collective = first->collective;
    r.dtype = first->dtype;
    r.error_code = SO_ERR_DEADLOCK;
    r.error_message = message;
    ResponseTensor t;
    t.name = n.second;
    t.shape = first->shape;
    r.tensors.push_back(std::move(t));
    ready_.push_back(std::move(r));
    table_.erase(n.second);
  }
  last_change_ = now;
  blocked_since_ = -1;
  return true;
}

std::vector<std::string> Negotiator::Stalled(double now, double threshold) const {
  std::vector<std::pair<uint64_t, std::string>> lines;
  if (threshold < 0) return {};
  for (const auto& kv : table_) {
    const Entry& e = kv.second;
    if (now - e.first_seen < threshold) continue;
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      if (!e.by_rank[r] && !joined_[r]) missing.push_back(r);
    }
    std::ostringstream s;
    s << CollectiveName(FirstRequest(e)->collective) << " '" << kv.first << "' (waited "
      << static_cast<int>(now - e.first_seen) << " s for " << RankList(Named(missing)) << ")";
    lines.emplace_back(e.arrival, s.str());
  }
  std::sort(lines.begin(), lines.end());
  std::vector<std::string> out;
  for (auto& l : lines) out.push_back(std::move(l.second));
  return out;
}

}  // namespace scaleout
