#include "coordinator/controller.h"

#include <sstream>

#include "common/logging.h"
#include "fusion/fusion_planner.h"

namespace scaleout {
namespace {

bool Identical(const Request& a, const Request& b) {
  return a.name == b.name && a.shape == b.shape && a.priority == b.priority && a.SameParams(b);
}

}  // namespace

Controller::Controller(ControlChannel* channel, const Config& config, ProcessSetInfo set)
    : channel_(channel),
      config_(config),
      set_(std::move(set)),
      rank_(channel->rank()),
      size_(channel->size()),
      cache_(config.cache_capacity, channel->size()),
      hold_(config.cycle_time_ms, config.fusion_threshold_bytes) {
  if (rank_ == 0) {
    negotiator_ = std::make_unique<Negotiator>(size_, &cache_, set_.ranks);
    live_.assign(size_, true);
    awaiting_ack_.assign(size_, false);
  }
}

void Controller::Submit(const Request& request, double now) {
  if (rank_ == 0) {
    negotiator_->Add(0, request, now);
    return;
  }
  const int slot = cache_.Lookup(request.name);
  const Request* cached = slot >= 0 ? cache_.Params(slot, rank_) : nullptr;
  if (cached != nullptr && Identical(*cached, request)) {
    outgoing_.cached_slots.push_back(slot);
    ++stats_.requests_sent_cached;
  } else {
    outgoing_.full.push_back(request);
    if (slot >= 0) cache_.SetParams(slot, rank_, request);
    ++stats_.requests_sent_full;
  }
  if (slot < 0) sent_[request.name] = request;  // read back only when a response assigns a slot
  has_outgoing_ = true;
}

void Controller::SubmitJoin() {
  if (rank_ == 0) {
    negotiator_->Join(0);
    return;
  }
  outgoing_.join = true;
  has_outgoing_ = true;
}

Status Controller::SetBlocked(bool blocked, double now) {
  if (state_ != State::kRunning) return Status::OK();
  if (rank_ == 0) {
    negotiator_->SetBlocked(0, blocked, now);
    return Status::OK();
  }
  if (rank_zero_gone_) return Status::OK();
  // At once, with whatever was queued: a rank about to execute must not look blocked to rank 0.
  outgoing_.blocked = blocked ? 1 : 0;
  return SendOutgoing();
}

Status Controller::SendOutgoing() {
  Status s = channel_->Send(0, EncodeRequests(outgoing_));
  if (!s.ok()) return s;
  ++stats_.messages_sent;
  outgoing_ = RequestMessage();
  has_outgoing_ = false;
  return Status::OK();
}

void Controller::ShutDownWorkers(const std::vector<uint8_t>& message) {
  state_ = State::kShuttingDown;
  bool any = false;
  for (int r = 1; r < size_; ++r) {
    if (!live_[r]) continue;
    channel_->Send(r, message);
    awaiting_ack_[r] = true;
    any = true;
  }
  if (!any) state_ = State::kDone;
}

void Controller::PeerDied(int rank, const std::string& why) {
  if (rank_ == 0) {
    if (rank <= 0 || rank >= size_ || !live_[rank]) return;
    live_[rank] = false;
    awaiting_ack_[rank] = false;
    negotiator_->RankGone(rank, why);
    return;
  }
  if (rank == 0) Halt(why, rank);
}

void Controller::Halt(const std::string& why, int culprit) {
  if (rank_zero_gone_) return;
  rank_zero_gone_ = true;
  halt_status_ =
      Status::ShutDown(why + "; collectives can no longer complete").WithCulprits({culprit});
  state_ = State::kDone;
}

bool Controller::DetectDeadlock(double now, double hold) {
  if (rank_ != 0 || state_ != State::kRunning) return false;
  const bool found = negotiator_->DetectDeadlock(now, hold);
  if (found) SO_LOG(kError, negotiator_->ready().back().error_message << set_.Where());
  return found;
}

void Controller::Retune(size_t fusion_threshold_bytes, double cycle_time_ms) {
  config_.fusion_threshold_bytes = fusion_threshold_bytes;
  config_.cycle_time_ms = cycle_time_ms;
  hold_.Retune(cycle_time_ms, fusion_threshold_bytes);
}

bool Controller::busy() const {
  if (state_ == State::kShuttingDown) return true;
  return rank_ == 0 && negotiator_->HasReady();
}

void Controller::BeginShutdown() {
  if (state_ != State::kRunning) return;
  if (rank_zero_gone_) {
    state_ = State::kDone;
    return;
  }
  if (rank_ == 0) {
    ShutDownWorkers(EncodeSignal(MessageType::kShutdown));
  } else {
    state_ = State::kShuttingDown;
    channel_->Send(0, EncodeSignal(MessageType::kShutdown));
  }
}

Status Controller::Poll(double now, std::vector<Response>* out) {
  if (state_ == State::kDone) return Status::OK();
  return rank_ == 0 ? PollRankZero(now, out) : PollWorker(out);
}

Status Controller::PollWorker(std::vector<Response>* out) {
  if (has_outgoing_ && state_ == State::kRunning && !rank_zero_gone_) {
    Status s = SendOutgoing();
    if (!s.ok()) return s;
  }
  for (;;) {
    bool got = false;
    int src = -1;
    std::vector<uint8_t> bytes;
    Status s = channel_->TryReceive(&got, &src, &bytes);
    if (!s.ok()) return s;
    if (!got) return Status::OK();
    switch (PeekType(bytes)) {
      case MessageType::kResponses: {
        std::vector<Response> responses = DecodeResponses(bytes);
        Resolve(&responses);
        for (Response& r : responses) out->push_back(std::move(r));
        break;
      }
      case MessageType::kShutdown: {
        // Rank 0 is leaving: everything before this message has been received and returned.
        channel_->Send(0, EncodeSignal(MessageType::kAck));
        rank_zero_gone_ = true;
        const std::string reason = DecodeShutdownReason(bytes);
        // A plain shutdown is rank 0's own doing; one with a reason (a stall) blames no rank.
        halt_status_ =
            reason.empty()
                ? Status::ShutDown(
                      "rank 0 has shut down scaleout; collectives can no longer complete")
                      .WithCulprits({set_.JobRank(0)})
                : Status::ShutDown(reason);
        state_ = State::kDone;
        return Status::OK();
      }
      case MessageType::kAck:
        state_ = State::kDone;
        return Status::OK();
      case MessageType::kNotice: {  // rank 0's stall report: every rank says it (Note [Stalls])
        std::istringstream lines(DecodeNotice(bytes));
        for (std::string line; std::getline(lines, line);) SO_LOG(kWarning, line);
        break;
      }
      default:
        return Status::Internal("unexpected control message on rank " + std::to_string(rank_));
    }
  }
}

// Restores names of compactly sent tensors, records new cache slots, forgets answered requests.
void Controller::Resolve(std::vector<Response>* responses) {
  for (Response& r : *responses) {
    for (ResponseTensor& t : r.tensors) {
      if (t.assigns_slot) {
        cache_.Record(t.cache_slot, t.name);
      } else if (t.name.empty()) {
        t.name = cache_.NameOf(t.cache_slot);
      }
      auto it = sent_.find(t.name);
      if (it == sent_.end()) continue;
      if (t.assigns_slot) cache_.SetParams(t.cache_slot, rank_, it->second);
      sent_.erase(it);
    }
  }
}

Status Controller::PollRankZero(double now, std::vector<Response>* out) {
  for (;;) {
    bool got = false;
    int src = -1;
    std::vector<uint8_t> bytes;
    Status s = channel_->TryReceive(&got, &src, &bytes);
    if (!s.ok()) return s;
    if (!got) break;
    switch (PeekType(bytes)) {
      case MessageType::kRequests: {
        if (state_ != State::kRunning || !live_[src]) break;  // leaving: drop late requests
        RequestMessage m = DecodeRequests(bytes);
        for (int32_t slot : m.cached_slots) {
          const Request* params = cache_.Params(slot, src);
          if (params == nullptr) {
            return Status::Internal("rank " + std::to_string(src) + " named response-cache slot " +
                                    std::to_string(slot) + " that it never sent in full");
          }
          negotiator_->Add(src, *params, now);
        }
        for (Request& req : m.full) {
          const int slot = cache_.Lookup(req.name);
          if (slot >= 0) cache_.SetParams(slot, src, req);
          negotiator_->Add(src, std::move(req), now);
        }
        if (m.join) negotiator_->Join(src);
        if (m.blocked >= 0) negotiator_->SetBlocked(src, m.blocked != 0, now);
        break;
      }
      case MessageType::kShutdown:
        if (state_ == State::kRunning) {
          // Work that became ready before src left needs src: send it now, ahead of the ack, so
          // that src executes it too. Everything sent to src precedes the ack.
          if (negotiator_->HasReady()) {
            Status sent = SendReady(now, out, /*all=*/true);
            if (!sent.ok()) return sent;
          }
          live_[src] = false;
          negotiator_->RankGone(src);
          channel_->Send(src, EncodeSignal(MessageType::kAck));
        }
        // While we shut down ourselves, src will still answer our kShutdown with kAck.
        break;
      case MessageType::kAck:
        awaiting_ack_[src] = false;
        live_[src] = false;
        break;
      default:
        return Status::Internal("unexpected control message from rank " + std::to_string(src));
    }
  }
  if (state_ == State::kShuttingDown) {
    bool waiting = false;
    for (int r = 1; r < size_; ++r) waiting = waiting || awaiting_ack_[r];
    if (!waiting) state_ = State::kDone;
    return Status::OK();
  }
  return Dispatch(now, out);
}

// Note [Dispatch] (fusion/fusion_hold.h).
Status Controller::Dispatch(double now, std::vector<Response>* out) {
  if (!negotiator_->HasReady()) return Status::OK();
  // What a round left behind (Note [Priority]) has waited its turn already: it is not held.
  if (!round_left_ && hold_.Hold(now, negotiator_->HasPartial(), negotiator_->ready()))
    return Status::OK();
  return SendReady(now, out);
}

Status Controller::SendReady(double now, std::vector<Response>* out, bool all) {
  hold_.Sent();
  std::vector<Response> later;
  std::vector<Response> round =
      TakeRound(negotiator_->TakeReady(), all ? 0 : config_.priority_bytes, &later);
  round_left_ = !later.empty();
  if (round_left_) negotiator_->PutBack(std::move(later));
  std::vector<Response> plan = PlanFusion(std::move(round), config_.fusion_threshold_bytes);
  std::vector<uint8_t> bytes = EncodeResponses(plan);
  const size_t length = bytes.size();
  int last = 0;  // the last live worker gets the bytes themselves, the others copies
  for (int r = 1; r < size_; ++r) last = live_[r] ? r : last;
  for (int r = 1; r < size_; ++r) {
    if (!live_[r]) continue;
    Status s = channel_->Send(r, r == last ? std::move(bytes) : bytes);
    if (!s.ok()) return s;
    ++stats_.messages_sent;
  }
  if (LogEnabled(LogLevel::kDebug)) {
    size_t tensors = 0;
    for (const Response& r : plan) tensors += r.tensors.size();
    SO_LOG(kDebug, "dispatch at " << now << ": " << plan.size() << " responses, " << tensors
                                  << " tensors, " << length << " bytes to each rank");
  }
  for (Response& r : plan) out->push_back(std::move(r));
  return Status::OK();
}

std::vector<std::string> Controller::StallReport(double now, double threshold) {
  if (rank_ != 0) return {};
  std::vector<std::string> lines = negotiator_->StallReport(now, threshold);
  for (std::string& line : lines) line += set_.Where();
  if (lines.empty() || state_ != State::kRunning) return lines;
  // Note [Stalls]: the ranks that wait are told too, naming who they wait for.
  std::string text;
  for (const std::string& line : lines) text += (text.empty() ? "" : "\n") + line;
  const std::vector<uint8_t> bytes = EncodeNotice(text);
  for (int r = 1; r < size_; ++r) {
    if (live_[r]) channel_->Send(r, bytes);
  }
  return lines;
}

bool Controller::StallShutdown(double now, double threshold) {
  if (rank_ != 0 || state_ != State::kRunning || threshold <= 0) return false;
  if (negotiator_->Stalled(now, threshold).empty()) return false;
  // Every pending collective fails: name them all, not only those past the threshold.
  const std::vector<std::string> stalled = negotiator_->Stalled(now, 0);
  constexpr size_t kMaxNamed = 10;
  std::ostringstream msg;
  msg << "stall shutdown: ";
  for (size_t i = 0; i < stalled.size() && i < kMaxNamed; ++i) msg << (i ? "; " : "") << stalled[i];
  if (stalled.size() > kMaxNamed) msg << "; and " << (stalled.size() - kMaxNamed) << " more";
  auto source = config_.sources.find("SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS");
  msg << ". Not every rank submitted " << (stalled.size() == 1 ? "it" : "them") << " within "
      << (source == config_.sources.end() || source->second == "default"
              ? std::string("SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS")
              : source->second)
      << "=" << threshold << " s, so scaleout has shut down on every rank, as Horovod does (a rank "
      << "may have skipped a collective or used another name for it); call shutdown() and init() "
      << "to start again";
  halt_status_ = Status::ShutDown(msg.str());
  SO_LOG(kError, halt_status_.message());
  ShutDownWorkers(EncodeShutdown(halt_status_.message()));
  return true;
}

}  // namespace scaleout
