#include "coordinator/coordinator.h"

#include <cctype>
#include <chrono>
#include <future>
#include <thread>
#include <sched.h>
#include <time.h>

#include "common/hash.h"
#include "common/logging.h"

namespace scaleout {
namespace {

double Now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

double CpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Note [Deadlock]: a rank counts as blocked once, for this long, a thread has waited on a
// handle, nothing was submitted, and the process's other threads used under kIdleCpuShare of a
// core (a rank still computing is not blocked, whatever it waits for).
constexpr double kBlockedAfterSeconds = 0.3;
constexpr double kSampleSeconds = 0.1;
constexpr double kIdleCpuShare = 0.05;

// Note [Waiting]
// While this rank waits for other ranks, the thread polls the control channel: spinning first
// (lowest latency), then yielding the core, then sleeping in growing steps, so that a rank that
// waits long for a slower peer leaves the compute threads their cores. With more ranks on the
// machine than CPUs (Config::oversubscribed) it yields from the start: a spinning rank holds
// the core the rank it waits for needs (a 4 KiB allreduce back to back at 4 ranks on 2 cores
// took 70-80 us with the spin, 33 us without; at 2 ranks the same either way). With nothing
// submitted it sleeps on the request queue and costs nothing; it still wakes every few milliseconds
// so that rank 0 answers another rank's shutdown promptly.
// Note [Wake-ups]
// Waking a thread that sleeps (a futex, a condition variable, a blocking read) on another CPU
// costs what the machine makes it cost, and on this VM that flips between states minute to
// minute: a round trip of two wake-ups between two processes on the two vCPUs takes a few
// microseconds in one state and 70-80 us in the other, while the same trip on one CPU (6 us)
// or with a polling reader (3.4 us) does not change (benchmarks/wakeup.py, 2026-11-26; a
// host that stops polling for an idle vCPU and must schedule it again would do this). In that
// state every hand-off between threads that sleep pays tens of microseconds: a submission to
// a sleeping coordinator thread, a completion to a sleeping waiter. So the waits that follow
// work likely to be answered soon yield instead of sleeping, for a bounded time: a waiter for
// a handle for 100 us (HandleTable::Wait), the coordinator thread for 100 us after it last made
// progress (Backoff), and a synchronous call runs the coordinator itself (Note [Caller
// drives]). With one rank in the slow state, `synchronize(allreduce_async_(x))` of 4 KiB took
// 76 us before and 3.7 us after; at two ranks the asynchronous 4 KiB allreduce back to back
// went from 8.9-9.4 us to 8.1 us (benchmarks/small_collectives.py).
constexpr int kSpinRounds = 200;
constexpr int kYieldRounds = 2000;
constexpr double kMaxSleepSeconds = 200e-6;
constexpr double kIdleWakeSeconds = 5e-3;
constexpr double kLingerSeconds = 100e-6;

// The status of the exception being handled: call it inside a catch block. What is neither
// escapes as before.
Status CaughtStatus(const char* context) {
  try {
    throw;
  } catch (const InternalError& e) {
    return Status::Internal(e.message);
  } catch (const std::exception& e) {
    return Status::Internal(std::string(context) + e.what());
  }
}

}  // namespace

Coordinator::Coordinator(const Config& config, ControlChannel* channel, const DataPlane& plane,
                         HandleTable* handles, RequestQueue* queue, PeerLiveness* liveness,
                         ProcessSetInfo set)
    : config_(config),
      controller_(channel, config, set),
      endpoints_(static_cast<int>(plane.transports.size()), config.ep_cores),
      executor_(plane, &endpoints_),
      handles_(handles),
      queue_(queue),
      spin_rounds_(config.oversubscribed ? 0 : kSpinRounds),
      liveness_(liveness),
      set_(std::move(set)),
      known_dead_(liveness->size(), false) {
  // One timeline per job: the global set's coordinator writes it.
  if (set_.id != 0) config_.timeline_path.clear();
  if (executor_.lane() != nullptr) {
    executor_.lane()->SpinFirst(!config.oversubscribed);
    executor_.lane()->SetAway(!config_.fast_lane);
  }
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::EnableAutotune(const AutotuneOptions& options,
                                 std::unique_ptr<std::ostream> log) {
  autotune_log_ = std::move(log);
  autotuner_ = std::make_unique<Autotuner>(options, autotune_log_.get());
}

void Coordinator::Start(int rank, int core) {
  // Not fatal: failing init on rank 0 alone would leave the other ranks waiting for it.
  rank_ = rank;
  const std::string& path =
      config_.timeline_path == "DYNAMIC" ? std::string() : config_.timeline_path;
  Status s = timeline_.Open(path, rank, Now(), config_.timeline_mark_cycles);
  if (!s.ok()) SO_LOG(kWarning, s.message() << "; no timeline is written");
  // Init returns once the thread is pinned, so that what the user then observes holds.
  // The promise moves into the thread: Start may return (and its frame go) while set_value is
  // still finishing.
  std::promise<void> pinned;
  std::future<void> started = pinned.get_future();
  thread_ = std::thread([this, core, pinned = std::move(pinned)]() mutable {
    endpoints_.PinServerZero();
    if (core >= 0) {
      if (PinCurrentThread(core)) {
        SO_LOG(kInfo, "coordinator thread pinned to CPU " << core);
      } else {
        SO_LOG(kWarning, "could not pin the coordinator thread to CPU " << core);
      }
    }
    pinned.set_value();
    Loop();
  });
  started.wait();
  std::lock_guard<std::mutex> lock(timeline_mu_);
  started_ = true;
}

void Coordinator::Stop() {
  if (!thread_.joinable()) return;
  stop_requested_ = true;
  queue_->Wake();
  thread_.join();
}

void Coordinator::Loop() {
  Status fatal;
  std::unique_lock<std::mutex> lock(step_mu_, std::defer_lock);
  try {
    for (;;) {
      lock.lock();
      if (!caller_fatal_.ok()) {  // before the shutdown check: the error must be reported
        fatal = caller_fatal_;
        break;
      }
      // After rank 0 has left, keep serving (failing) this rank's requests until its own shutdown.
      if (controller_.shutdown_complete() && !(controller_.rank_zero_gone() && !stop_requested_))
        break;
      bool progress = false;
      fatal = Step(Now(), /*on_caller=*/false, &progress);
      if (!fatal.ok()) break;
      const bool waiting_remote = WaitingRemote();
      lock.unlock();
      if (progress || queue_->HasWork()) {
        idle_rounds_ = 0;
        last_work_ = Now();
        continue;
      }
      Backoff(waiting_remote);
    }
  } catch (...) {
    fatal = CaughtStatus("coordinator thread failed: ");
  }
  if (!lock.owns_lock()) lock.lock();
  loop_done_ = true;
  if (!fatal.ok()) fatal = BlameDeath(fatal);
  if (!fatal.ok()) SO_LOG(kError, fatal.message());
  Status why = !fatal.ok() ? fatal
               : controller_.halted()
                   ? controller_.halt_status()
                   : Status::ShutDown(
                         "scaleout was shut down on this rank while the collective was pending");
  // Completes everything registered (queued, pending, or mid-execution when an exception hit)
  // and makes later enqueues fail at once: nothing is left waiting on a stopped thread.
  if (set_.id == 0) {
    handles_->Close(why);
  } else {
    handles_->CloseSet(set_.id, why);
  }
  pending_.clear();
  joins_.clear();
  queue_->TakeAll();
  timeline_.Close();
  std::lock_guard<std::mutex> timeline_lock(timeline_mu_);
  loop_finished_ = true;
  if (timeline_request_) {
    timeline_request_->done.set_value(
        Status::ShutDown("scaleout shut down before the timeline was changed"));
    timeline_request_.reset();
  }
}

Status Coordinator::SetTimeline(const std::string& path, bool mark_cycles) {
  std::future<Status> done;
  {
    std::lock_guard<std::mutex> lock(timeline_mu_);
    if (loop_finished_ || !started_) {
      return Status::ShutDown("scaleout is shut down: the timeline cannot be changed");
    }
    if (timeline_request_) {
      return Status::InvalidArgument("another thread is starting or stopping the timeline");
    }
    timeline_request_ = std::make_unique<TimelineRequest>();
    timeline_request_->path = path;
    timeline_request_->mark_cycles = mark_cycles;
    done = timeline_request_->done.get_future();
    timeline_request_pending_ = true;
  }
  queue_->Wake();
  return done.get();
}

void Coordinator::ApplyTimelineRequest(double now) {
  if (!timeline_request_pending_) return;
  std::lock_guard<std::mutex> lock(timeline_mu_);
  timeline_request_pending_ = false;
  if (!timeline_request_) return;
  Status s;
  if (timeline_request_->path.empty()) {
    timeline_.Close();
  } else {
    s = timeline_.Open(timeline_request_->path, rank_, now, timeline_request_->mark_cycles);
  }
  timeline_request_->done.set_value(s);
  timeline_request_.reset();
}

// Note [Liveness]: MPI can see a peer's death first: the data plane (a shared-memory sync
// checks the pid it waits for), or the control channel (Open MPI's fault-tolerant runtime fails
// MPI_Iprobe with MPI_ERR_PROC_FAILED when a rank on another host died). The monitor, which
// checks pids twice a second and hears a remote rank's link close, names the rank in the words
// every other path uses: give it a moment, on a transport failure only.
Status Coordinator::BlameDeath(Status status) const {
  if (status.code() != SO_ERR_TRANSPORT) return status;
  for (int i = 0; i < 20 && !liveness_->AnyDead(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return liveness_->AnyDead() ? liveness_->Interruption() : status;
}

bool Coordinator::WaitingRemote() const {
  return !pending_.empty() || !joins_.empty() || controller_.busy() || shutdown_begun_;
}

// Runs the coordinator on a waiting caller's thread: Note [Caller drives].
bool Coordinator::Drive(const TensorEntry& entry) {
  std::unique_lock<std::mutex> lock(step_mu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    queue_->Wake();  // the thread is mid-step: it must not sleep past this caller's entry
    return false;
  }
  bool done = false;
  if (!loop_done_ && !stop_requested_ && caller_fatal_.ok()) {
    try {
      done = TryLane(entry);
    } catch (...) {
      caller_fatal_ = CaughtStatus("coordinator step failed: ");  // the thread ends with it
    }
  }
  int idle = 0;
  while (!done && !loop_done_ && !stop_requested_ && caller_fatal_.ok()) {
    bool progress = false;
    Status s;
    try {
      s = Step(Now(), /*on_caller=*/true, &progress);
    } catch (...) {
      s = CaughtStatus("coordinator step failed: ");
    }
    if (!s.ok()) {
      caller_fatal_ = s;  // the thread ends the loop with it, as if its own step had failed
      break;
    }
    done = entry.finished.load(std::memory_order_acquire);
    if (done) break;
    if (progress || queue_->HasWork()) {
      idle = 0;
      continue;
    }
    const Pause pause = PauseAfter(++idle);
    if (pause == Pause::kSleep) break;  // the wait would sleep now: the thread takes over
    if (pause == Pause::kYield) sched_yield();
  }
  // What is left (this entry, or others submitted meanwhile) is the thread's again.
  const bool left = !done || WaitingRemote() || queue_->HasWork() || !caller_fatal_.ok();
  lock.unlock();
  if (left) queue_->Wake();
  return done;
}

namespace {

// What every rank must post to agree on an allreduce on the lane (Note [Fast lane]).
LanePost PostFor(const Request& q, int slot) {
  LanePost post;
  post.key = static_cast<uint64_t>(static_cast<uint32_t>(slot)) << 32 |
             static_cast<uint64_t>(static_cast<uint8_t>(q.dtype)) << 24 |
             static_cast<uint64_t>(static_cast<uint8_t>(q.reduce_op)) << 16 |
             static_cast<uint64_t>(q.shape.size() & 0xffff);
  post.count = static_cast<uint64_t>(q.NumElements());
  post.shape = Fnv1a(q.shape);
  return post;
}

}  // namespace

bool Coordinator::OffLane() const {
  return !config_.fast_lane || timeline_.enabled() || timeline_request_pending_ ||
         (autotuner_ != nullptr && !autotuner_->done()) || !pending_.empty() || !joins_.empty() ||
         shutdown_begun_ || controller_.busy() || controller_.halted();
}

// Note [Fast lane]: only where nothing else is under way on this rank, so that the collective
// is the next one in every rank's order whichever way it goes.
int Coordinator::LaneSlot(const Request& q) {
  FastLane* lane = executor_.lane();
  if (lane == nullptr || q.collective != SO_ALLREDUCE || q.prescale != 1.0 || q.postscale != 1.0 ||
      liveness_->AnyDead())
    return -1;
  const bool off = OffLane();
  lane->SetAway(off);
  if (off) return -1;
  return controller_.cache().Lookup(q.name);  // -1: its slot comes with its first response
}

bool Coordinator::RunLane(TensorEntry* entry, int slot, Status* status) {
  const Request& q = entry->request;
  Response& r = lane_response_;  // kept for its capacity: a lane call allocates nothing here
  r.collective = q.collective;
  r.dtype = q.dtype;
  r.reduce_op = q.reduce_op;
  r.tensors.resize(1);
  ResponseTensor& t = r.tensors[0];
  t.name = q.name;
  t.shape = q.shape;
  t.cache_slot = slot;
  bool agreed = false;
  *status = executor_.RunOnLane(r, entry, PostFor(q, slot), &agreed);
  if (agreed) ++accepted_;
  return agreed;
}

bool Coordinator::TryLane(const TensorEntry& entry) {
  const int slot = LaneSlot(entry.request);
  if (slot < 0) return false;
  std::vector<std::shared_ptr<TensorEntry>> taken = queue_->TakeAll();
  const double now = Now();
  if (taken.size() != 1 || taken[0].get() != &entry) {
    for (auto& e : taken) Accept(e, now);
    return false;
  }
  Status s;
  if (!RunLane(taken[0].get(), slot, &s)) {
    Accept(taken[0], now);
    return false;
  }
  handles_->Complete(taken[0].get(), BlameDeath(s));
  return true;
}

bool Coordinator::LaneNow(TensorEntry* entry, Status* status) {
  std::unique_lock<std::mutex> lock(step_mu_, std::try_to_lock);
  if (!lock.owns_lock() || loop_done_ || stop_requested_ || !caller_fatal_.ok()) return false;
  bool done = false;
  try {
    // Work queued before it goes first (through negotiation): this one is not the next.
    const int slot = queue_->HasWork() ? -1 : LaneSlot(entry->request);
    Status s;
    done = slot >= 0 && RunLane(entry, slot, &s);
    if (done) *status = BlameDeath(s);
  } catch (...) {
    caller_fatal_ = CaughtStatus("coordinator step failed: ");  // the thread ends with it
  }
  const bool left = queue_->HasWork() || !caller_fatal_.ok();
  lock.unlock();
  if (left) queue_->Wake();  // submitted meanwhile by another thread: the thread's to run
  return done;
}

Status Coordinator::Step(double now, bool on_caller, bool* made_progress) {
  ApplyTimelineRequest(now);
  if (stop_requested_ && !shutdown_begun_) {
    shutdown_begun_ = true;
    controller_.BeginShutdown();
  }
  for (auto& entry : queue_->TakeAll()) {
    *made_progress = true;
    Accept(entry, now);
  }
  // Note [Fast lane]: no rank waits on the lane for this one while it has work in negotiation.
  if (executor_.lane() != nullptr && OffLane()) executor_.lane()->SetAway(true);
  std::vector<Response>& responses = responses_;
  responses.clear();
  Status s = controller_.Poll(now, &responses);
  if (!s.ok()) return s;
  if (!responses.empty()) {
    *made_progress = true;
    timeline_.MarkCycle(now);
    candidate_since_ = -1;
    if (reported_blocked_) {  // before executing: rank 0 must not count this rank as blocked
      reported_blocked_ = false;
      Status unblocked = controller_.SetBlocked(false, now);
      if (!unblocked.ok()) return unblocked;
    }
  }
  for (const Response& r : responses) Execute(r);
  timeline_.Flush();  // what this step wrote is in the file now (Note [Timeline])
  if (config_.deadlock_check_seconds > 0) {
    // The sample measures the other threads' CPU time from the coordinator thread's.
    if (!on_caller) SampleBlocked(now);
    controller_.DetectDeadlock(now, config_.deadlock_check_seconds);
  }
  if (!config_.stall_check_disable && config_.stall_check_seconds > 0 &&
      now - last_stall_check_ > 1.0) {
    last_stall_check_ = now;
    ReportStalls(now);
    // Note [Stall shutdown]
    if (config_.stall_shutdown_active())
      controller_.StallShutdown(now, config_.stall_shutdown_seconds);
  }
  CheckPeersAlive();
  if (controller_.halted()) FailPending(controller_.halt_status());
  if (executor_.lane() != nullptr) executor_.lane()->SetAway(OffLane());  // what is left now
  return Status::OK();
}

void Coordinator::CheckPeersAlive() {
  if (!liveness_->AnyDead()) return;
  const int self = controller_.rank();
  for (int r = 0; r < liveness_->size(); ++r) {
    if (known_dead_[r]) continue;
    const std::string why = liveness_->DeathOf(r);
    if (why.empty()) continue;
    known_dead_[r] = true;
    SO_LOG(kError, why);
    if (liveness_->networked()) {
      // Every rank learns of this death now: all stop at once, without another message (a
      // message to the dead rank could crash MPI; its collectives can never complete).
      controller_.Halt(why, r);
    } else if (self == 0) {
      // Rank 0 fails what needs the dead rank; the others hear of it from rank 0.
      controller_.PeerDied(r, why);
    } else if (r == 0) {
      // Without rank 0 nothing more completes here. Blamed on the job's first death: rank 0 may
      // have left because of an earlier one (its survivors' checks done, it exits), and that one
      // is the cause every later collective names (the same rank wherever the race went).
      const int first = liveness_->FirstDead();
      if (first > 0) {
        controller_.Halt(liveness_->DeathOf(first), first);
      } else {
        controller_.PeerDied(r, why);
      }
    }
  }
}

namespace {
// The timeline's name of a collective, as Horovod's: ALLREDUCE, ...
std::string TimelineName(int32_t collective) {
  std::string upper = CollectiveName(collective);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return upper;
}
}  // namespace

void Coordinator::Accept(const std::shared_ptr<TensorEntry>& entry, double now) {
  if (shutdown_begun_ || controller_.halted()) {
    handles_->Complete(entry.get(),
                       controller_.halted()
                           ? controller_.halt_status()
                           : Status::ShutDown("scaleout is shutting down on this rank"));
    return;
  }
  entry->submitted_at = now;
  ++accepted_;
  if (entry->is_join) {
    joins_.push_back(entry);
    controller_.SubmitJoin();
    return;
  }
  pending_[entry->request.name] = entry;
  if (timeline_.enabled()) {
    timeline_.Begin(entry->request.name, "NEGOTIATE_" + TimelineName(entry->request.collective),
                    now);
  }
  controller_.Submit(entry->request, now);
}

void Coordinator::Execute(const Response& r) {
  if (r.collective == SO_JOIN) {
    const Status status = r.is_error() ? r.error() : Status::OK();
    for (auto& j : joins_) {
      j->join_rank = set_.JobRank(r.last_joined_rank);
      handles_->Complete(j.get(), status);
    }
    joins_.clear();
    return;
  }
  std::vector<TensorEntry*> entries;
  std::vector<std::shared_ptr<TensorEntry>> owned;
  entries.reserve(r.tensors.size());
  bool parts_left = false;  // a tensor of the response has parts to come (Note [Priority])
  for (const ResponseTensor& t : r.tensors) {
    auto it = pending_.find(t.name);
    if (it == pending_.end()) {
      entries.push_back(nullptr);
      continue;
    }
    owned.push_back(it->second);
    entries.push_back(it->second.get());
    if (t.is_part() && t.part_first + t.part_count < it->second->request.NumElements()) {
      parts_left = true;
      it->second->stall_reported = true;  // under way, not waiting for other ranks
      continue;
    }
    pending_.erase(it);
  }
  // Note [Fast lane]: back on the lane as soon as nothing else is pending, before the data moves
  // (the others, done with it first, may post the next collective meanwhile: into the other
  // parity's areas).
  if (executor_.lane() != nullptr && !OffLane()) executor_.lane()->SetAway(false);
  const bool timed = timeline_.enabled() || LogEnabled(LogLevel::kDebug);
  const bool tuning = autotuner_ != nullptr && !autotuner_->done();
  const double agreed = timed || tuning ? Now() : 0;
  if (timeline_.enabled()) {
    for (size_t i = 0; i < entries.size(); ++i) {
      // A tensor in parts negotiated once, before its first (Note [Priority]).
      if (entries[i] != nullptr && r.tensors[i].part_first == 0)
        timeline_.End(entries[i]->request.name, agreed);
    }
  }
  Status status;
  if (r.is_error()) {
    status = r.error(set_.Where());
  } else if (r.collective != SO_BARRIER) {
    for (size_t i = 0; i < entries.size(); ++i) {
      SO_CHECK(entries[i] != nullptr || !r.joined_ranks.empty(),
               "response names '" + r.tensors[i].name + "', which this rank never submitted");
    }
    // Note [Stalls inside a collective]: the global set's only, for now (one record per rank).
    if (set_.id == 0) {
      static const std::string kNone;
      liveness_->execution().Begin(CollectiveName(r.collective),
                                   r.tensors.empty() ? kNone : r.tensors[0].name, r.tensors.size(),
                                   agreed > 0 ? agreed : Now());
    }
    if (timeline_.enabled()) {
      const std::string upper = TimelineName(r.collective);
      for (TensorEntry* e : entries) {
        if (e != nullptr) timeline_.Begin(e->request.name, upper, agreed);
      }
    }
    status = executor_.Execute(r, entries);
    if (set_.id == 0) liveness_->execution().End();
    status = BlameDeath(status);
    const double done = timed ? Now() : 0;
    SO_LOG(kDebug, "executed " << CollectiveName(r.collective) << " of " << entries.size()
                               << " tensors in " << (done - agreed) * 1e6 << " us");
    if (timeline_.enabled()) {
      const std::string fused = ", \"fused_tensors\": " + std::to_string(entries.size()) +
                                ", \"status\": " + JsonString(StatusName(status.code())) + "}";
      for (TensorEntry* e : entries) {
        if (e == nullptr) continue;
        timeline_.End(e->request.name, done,
                      "{\"dtype\": \"" + std::string(DataTypeName(e->request.dtype)) +
                          "\", \"shape\": \"" + ShapeString(e->request.shape) + "\"" + fused);
      }
    }
  }
  if (parts_left || !failed_parts_.empty()) {
    // Note [Priority]: a tensor in parts completes with its last part, with the first failure
    // of any of its parts. It stays pending (its name in flight) until then, so that no later
    // submission of the name can take a part meant for this one.
    for (size_t i = 0; i < entries.size(); ++i) {
      const ResponseTensor& t = r.tensors[i];
      if (entries[i] == nullptr || !t.is_part()) continue;
      const bool last = t.part_first + t.part_count >= entries[i]->request.NumElements();
      auto failed = failed_parts_.find(entries[i]);
      if (!last) {
        if (!status.ok() && failed == failed_parts_.end()) failed_parts_[entries[i]] = status;
        entries[i] = nullptr;
      } else if (failed != failed_parts_.end()) {
        handles_->Complete(entries[i], failed->second);
        failed_parts_.erase(failed);
        entries[i] = nullptr;
      }
    }
  }
  handles_->CompleteAll(entries, status);
  // After completion: the search and the log's writes delay no one's collective.
  // (An error response's status is its error: not ok.)
  if (tuning && status.ok() && r.collective != SO_BARRIER && autotuner_->Observe(r, agreed)) {
    controller_.Retune(autotuner_->fusion_threshold_bytes(), autotuner_->cycle_time_ms());
  }
}

void Coordinator::FailPending(const Status& status) {
  for (auto& kv : pending_) handles_->Complete(kv.second.get(), status);
  pending_.clear();
  failed_parts_.clear();
  for (auto& j : joins_) handles_->Complete(j.get(), status);
  joins_.clear();
}

void Coordinator::SampleBlocked(double now) {
  if (now - last_sample_ < kSampleSeconds) return;
  const double others = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
  const bool idle =
      last_sample_ > 0 && others - last_others_cpu_ < kIdleCpuShare * (now - last_sample_);
  const bool quiet = accepted_ == accepted_at_sample_;
  last_sample_ = now;
  last_others_cpu_ = others;
  accepted_at_sample_ = accepted_;
  // Note [Process sets]: blocked on this set, when every waiting thread waits on its handles.
  const int waiting = handles_->waiting();
  const bool candidate = idle && quiet && waiting > 0 &&
                         (set_.id == 0 || handles_->waiting(set_.id) == waiting) &&
                         (!pending_.empty() || !joins_.empty());
  if (!candidate) {
    candidate_since_ = -1;
  } else if (candidate_since_ < 0) {
    candidate_since_ = now;
  }
  const bool blocked = candidate_since_ >= 0 && now - candidate_since_ >= kBlockedAfterSeconds;
  if (blocked == reported_blocked_) return;
  reported_blocked_ = blocked;
  Status s = controller_.SetBlocked(blocked, now);
  if (!s.ok()) SO_LOG(kWarning, "could not tell rank 0 this rank's state: " << s.message());
}

void Coordinator::ReportStalls(double now) {
  for (const std::string& line : controller_.StallReport(now, config_.stall_check_seconds)) {
    SO_LOG(kWarning, line);
  }
  for (auto& kv : pending_) {
    TensorEntry* e = kv.second.get();
    if (e->stall_reported || now - e->submitted_at < config_.stall_check_seconds) continue;
    e->stall_reported = true;
    SO_LOG(kWarning, CollectiveName(e->request.collective)
                         << " '" << e->request.name << "' was submitted "
                         << static_cast<int>(now - e->submitted_at)
                         << " s ago and not every rank has submitted it yet" << set_.Where());
  }
}

Coordinator::Pause Coordinator::PauseAfter(int idle_rounds) const {
  if (idle_rounds < spin_rounds_) return Pause::kSpin;
  return idle_rounds < spin_rounds_ + kYieldRounds ? Pause::kYield : Pause::kSleep;
}

void Coordinator::Backoff(bool waiting_remote) {
  if (!waiting_remote) {
    idle_rounds_ = 0;
    // Note [Wake-ups]: for a moment after work, more is likely (the next gradient, the next
    // call): yield rather than sleep, so that it does not pay for waking this thread.
    if (Now() - last_work_ < kLingerSeconds) {
      sched_yield();
      return;
    }
    queue_->WaitForWork(kIdleWakeSeconds);
    return;
  }
  const Pause pause = PauseAfter(++idle_rounds_);
  if (pause == Pause::kSpin) return;
  if (pause == Pause::kYield) {
    sched_yield();
    return;
  }
  const int steps = idle_rounds_ - spin_rounds_ - kYieldRounds;
  const double sleep = std::min(kMaxSleepSeconds, 10e-6 * (1 + steps));
  queue_->WaitForWork(sleep);
}

}  // namespace scaleout
