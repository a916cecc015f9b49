// Note [Coordinator]
// ~~~~~~~~~~~~~~~~~~
// "Coordinator" means one thing: the background thread of one rank (one per process set on that
// rank), this class, that owns all its communication (Horovod's background thread). It takes
// submitted entries from the RequestQueue, drives the Controller (negotiation), executes the
// agreed responses through the CollectiveExecutor, completes handles, and reports stalls. Every
// rank has one. The rank that negotiates (Note [Negotiation]) is called rank 0 (of its set),
// never the coordinator.
//
// Threading: Start/Stop from the runtime's owner; everything else runs on the thread. The
// thread never calls into Python.
#ifndef SCALEOUT_COORDINATOR_COORDINATOR_H_
#define SCALEOUT_COORDINATOR_COORDINATOR_H_

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "collectives/collective_executor.h"
#include "collectives/endpoint_pool.h"
#include "common/config.h"
#include "coordinator/autotuner.h"
#include "coordinator/controller.h"
#include "coordinator/timeline.h"
#include "runtime/handle_table.h"
#include "runtime/peer_liveness.h"
#include "runtime/request_queue.h"

namespace scaleout {

class Coordinator {
 public:
  // `plane`: what the collectives move bytes through (collectives/data_plane.h).
  Coordinator(const Config& config, ControlChannel* channel, const DataPlane& plane,
              HandleTable* handles, RequestQueue* queue, PeerLiveness* liveness,
              ProcessSetInfo set = ProcessSetInfo());
  ~Coordinator();

  // Rank 0 of the global set, before Start: tune while the job runs (Note [Autotune]), writing
  // the CSV to `log` (may be null).
  void EnableAutotune(const AutotuneOptions& options, std::unique_ptr<std::ostream> log);
  // Opens the timeline (if configured) and starts the thread, pinned to CPU `core` if >= 0
  // (SCALEOUT_THREAD_AFFINITY; it takes precedence over SCALEOUT_EP_CORES for server 0).
  void Start(int rank, int core);
  // Runs the shutdown protocol with the other ranks, stops the thread, fails what is pending.
  void Stop();
  // Note [Caller drives]
  // A thread that submits a collective and waits on it at once (the synchronous calls:
  // allreduce_, broadcast, ...) says so (so_request.caller_waits), and the core does not wake
  // this coordinator's thread for it. The caller's wait then runs the coordinator's steps itself,
  // under the lock the thread holds for each of its own steps, when the thread is not running
  // one (it sleeps on an empty queue, or between polls), until its collective completes. So a
  // small collective costs no hand-off between threads: waking the sleeping thread and, at
  // completion, waking the caller each cost a context switch (microseconds on a VM, and a core
  // that another rank needs when ranks outnumber cores). Nothing else changes: the same steps,
  // negotiation and algorithms, run by one thread at a time, in the same order on every rank.
  // The caller drives only as long as the thread would spin or yield (Note [Waiting]); past that
  // (a late peer) it wakes the thread and sleeps on its handle as any waiter does, so the
  // deadlock check and the stall reports see it as before. Only small collectives are driven
  // (up to 64 KiB moved, Runtime::Enqueue): a large one gains little from saving two hand-offs,
  // belongs on the coordinator's core where scaleoutrun reserved one, and would keep the
  // caller's thread (and Ctrl-C, which Python handles between the wait's slices) for its whole
  // length.
  //
  // Runs the coordinator on the calling thread until `entry` completes or the wait would sleep;
  // false if it did not complete (the thread ran it, or it stopped, or the wait would sleep).
  // Any thread; the entry must have been enqueued on this coordinator's queue.
  bool Drive(const TensorEntry& entry);
  // Note [Fast lane]: runs `entry` (a synchronous allreduce that is in neither the queue nor the
  // handle table: Runtime::AllreduceNow) on the lane at once, on the calling thread, if it can:
  // true when it ran (its outcome in *status), false when nothing was done (no other thread's
  // step may be under way, no work queued, the lane's own conditions; then enqueue it).
  bool LaneNow(TensorEntry* entry, Status* status);
  // Starts writing the timeline to `path` (closing one being written), or stops it when `path`
  // is empty (Note [Timeline]). Called from any thread; returns once the coordinator thread has
  // done it, so that the file is complete when stop returns. Only rank 0 writes a file.
  Status SetTimeline(const std::string& path, bool mark_cycles);

 private:
  void Loop();
  // One round of the coordinator's work. `on_caller`: run by a caller (Note [Caller drives]).
  Status Step(double now, bool on_caller, bool* made_progress);
  // Whether work is pending on other ranks (the loop polls instead of sleeping).
  bool WaitingRemote() const;
  // A transport failure that a peer's death explains, as the death (Note [Liveness]).
  Status BlameDeath(Status status) const;
  void Accept(const std::shared_ptr<TensorEntry>& entry, double now);
  // Note [Fast lane]: runs the driving caller's entry on the lane if it can; true if it did.
  bool TryLane(const TensorEntry& entry);
  // The request's response-cache slot where it may take the lane now, else -1; says whether
  // this rank is away (FastLane::SetAway).
  int LaneSlot(const Request& q);
  // Runs `entry` on the lane under `slot`: true if every rank agreed (then *status is how it
  // went); false if nothing was done.
  bool RunLane(TensorEntry* entry, int slot, Status* status);
  // Whether this rank stays off the lane now: something is under way besides a lone caller's
  // collective, or the lane is off here (turned off, a timeline or autotuning under way).
  bool OffLane() const;
  void Execute(const Response& response);
  void FailPending(const Status& status);
  void ReportStalls(double now);
  // Note [Waiting]: what a wait does after `idle_rounds` polls that found nothing (the thread's
  // loop and a driving caller alike; a caller hands over where the thread would sleep).
  enum class Pause { kSpin, kYield, kSleep };
  Pause PauseAfter(int idle_rounds) const;
  void Backoff(bool waiting_remote);
  void ApplyTimelineRequest(double now);
  void SampleBlocked(double now);
  void CheckPeersAlive();

  Config config_;
  Controller controller_;
  Timeline timeline_;
  EndpointPool endpoints_;
  CollectiveExecutor executor_;
  HandleTable* handles_;
  RequestQueue* queue_;
  std::thread thread_;
  // Held by whichever thread runs a step (Note [Caller drives]); it guards everything below
  // that the loop's steps touch.
  std::mutex step_mu_;
  bool loop_done_ = false;  // the thread has left its loop: nothing may be driven
  std::unique_ptr<std::ostream> autotune_log_;
  std::unique_ptr<Autotuner> autotuner_;  // Note [Autotune]: rank 0 of the global set
  Status caller_fatal_;  // a driving caller's step failed: the thread ends the loop with it
  std::atomic<bool> stop_requested_{false};
  bool shutdown_begun_ = false;
  std::unordered_map<std::string, std::shared_ptr<TensorEntry>> pending_;  // submitted, by name
  std::vector<Response> responses_;  // a step's, kept for its capacity
  Response lane_response_;           // RunLane's, kept for its capacity
  std::vector<std::shared_ptr<TensorEntry>> joins_;
  double last_stall_check_ = 0;
  int idle_rounds_ = 0;
  int spin_rounds_;  // Note [Waiting]
  // Tensors in parts, still pending, whose earlier part failed: the first failure (Note
  // [Priority]); they complete with it at their last part.
  std::unordered_map<const TensorEntry*, Status> failed_parts_;
  double last_work_ = 0;  // when the loop last made progress (Note [Wake-ups])
  int rank_ = 0;

  // Note [Deadlock]: whether this rank's user threads are all blocked on scaleout.
  double last_sample_ = 0;
  double last_others_cpu_ = 0;  // CPU seconds of this process's other threads, at last_sample_
  uint64_t accepted_ = 0;       // entries taken from the queue, ever
  uint64_t accepted_at_sample_ = 0;
  double candidate_since_ = -1;
  bool reported_blocked_ = false;

  // Note [Liveness]: owned by the runtime, outlives this object.
  PeerLiveness* liveness_;
  ProcessSetInfo set_;
  std::vector<bool> known_dead_;

  // A start/stop of the timeline asked by a user thread, done by the coordinator thread.
  struct TimelineRequest {
    std::string path;
    bool mark_cycles = false;
    std::promise<Status> done;
  };
  std::mutex timeline_mu_;
  std::unique_ptr<TimelineRequest> timeline_request_;  // guarded by timeline_mu_
  bool started_ = false;                               // guarded by timeline_mu_
  bool loop_finished_ = false;                         // guarded by timeline_mu_
  std::atomic<bool> timeline_request_pending_{false};
};

}  // namespace scaleout

#endif  // SCALEOUT_COORDINATOR_COORDINATOR_H_
