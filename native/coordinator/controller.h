// Note [Negotiation]
// Rank 0 of the communicator negotiates (see Note [Coordinator]: that word names a thread, not
// this rank). Every other rank sends the requests its user submitted (in full, or as
// response-cache slots; see Note [Response cache]) to rank 0 as soon as they are enqueued.
// Rank 0 records them in its Negotiator, and when a name has been submitted by every rank (or
// the missing ranks have joined), it validates that all ranks agree, plans fusion, and sends the
// same list of responses to every rank, then executes it itself. Every rank executes every
// response list it receives, fully and in order, so the data-plane collectives line up.
// A rank with nothing submitted does no control-plane work at all: there is no periodic
// cycle, so nothing costs a cycle when idle and a lone request is sent at once.
//
// Shutdown: a rank that shuts down sends kShutdown to rank 0 and keeps executing responses
// until rank 0 answers kAck; rank 0 then fails everything that needed that rank. When rank 0
// shuts down it sends kShutdown to every live rank and waits for each kAck. Both sides drain
// their messages this way, so nothing stale is left in flight for a later init().
#ifndef SCALEOUT_COORDINATOR_CONTROLLER_H_
#define SCALEOUT_COORDINATOR_CONTROLLER_H_

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/config.h"
#include "coordinator/message.h"
#include "coordinator/negotiator.h"
#include "coordinator/process_set_info.h"
#include "coordinator/response_cache.h"
#include "fusion/fusion_hold.h"
#include "transport/control_channel.h"

namespace scaleout {

// The per-rank negotiation protocol, without threads or clocks of its own (the coordinator
// thread drives it; unit tests drive several of them over a fake channel).
class Controller {
 public:
  // `set`: the process set whose ranks the channel's are; what the controller reports names the
  // job's ranks and the set.
  Controller(ControlChannel* channel, const Config& config, ProcessSetInfo set = {});

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Queues this rank's requests for negotiation (validated locally already).
  void Submit(const Request& request, double now);
  void SubmitJoin();

  // Control-plane work: sends what was submitted; on rank 0 receives and negotiates. Appends to
  // *out the responses this rank must now execute, in order. `now` is monotonic seconds.
  Status Poll(double now, std::vector<Response>* out);

  // Whether rank 0 holds ready work back for fusion or shutdown is in progress: Poll soon.
  bool busy() const;
  // Rank 0: the fusion threshold and cycle time for what it plans from now on (Note [Autotune]).
  void Retune(size_t fusion_threshold_bytes, double cycle_time_ms);

  // This rank's user threads are all blocked on scaleout (or no longer are): told to rank 0 at
  // once (Note [Deadlock]).
  Status SetBlocked(bool blocked, double now);
  // A peer's process died (Note [Liveness]): rank 0 treats it as gone; a worker told that rank
  // 0 died halts, failing everything with `why`.
  void PeerDied(int rank, const std::string& why);
  // A peer died and every rank knows it (Note [Liveness]): this rank stops negotiating at once,
  // sending nothing more, and fails everything pending and later with `why`, blaming the job's
  // rank `culprit` (Note [Error details]).
  void Halt(const std::string& why, int culprit);
  // Rank 0: fails every pending collective when all ranks have been blocked for `hold` s.
  bool DetectDeadlock(double now, double hold);

  // Starts the shutdown protocol; Poll then completes it.
  void BeginShutdown();
  bool shutdown_complete() const { return state_ == State::kDone; }
  // Set when rank 0 shut down while this rank was running.
  bool rank_zero_gone() const { return rank_zero_gone_; }
  // Set when collectives can no longer complete because rank 0 ended the job (it left, or the
  // stall shutdown below): halt_status() says why, for every pending and later collective.
  bool halted() const { return !halt_status_.ok(); }
  const Status& halt_status() const { return halt_status_; }

  // Note [Stall shutdown]
  // With SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS, a collective that some ranks submitted and others
  // have not for that long ends the job, as in Horovod: rank 0 sends every rank a kShutdown that
  // carries one message naming each stalled collective and the ranks it waits for; every rank
  // then fails what it has pending, and everything it submits later, with that message (a
  // ShutDownError, which is Horovod's HorovodInternalError), and stops negotiating. The job
  // stays consistent: shutdown() works on every rank, and init() may start it again. Rank 0
  // only; returns true if it shut the job down now.
  bool StallShutdown(double now, double threshold);

  // Note [Stalls]
  // Collectives that have waited past the stall threshold (rank 0 only); each
  // line also goes to every live worker, which logs it, so every rank names the missing ranks.
  std::vector<std::string> StallReport(double now, double threshold);

  // Counters for tests and diagnostics.
  struct Stats {
    uint64_t requests_sent_full = 0;
    uint64_t requests_sent_cached = 0;
    uint64_t messages_sent = 0;
  };
  const Stats& stats() const { return stats_; }
  const ResponseCache& cache() const { return cache_; }

 private:
  enum class State { kRunning, kShuttingDown, kDone };

  Status PollRankZero(double now, std::vector<Response>* out);
  Status PollWorker(std::vector<Response>* out);
  Status Dispatch(double now, std::vector<Response>* out);
  // Sends a round of the ready work (Note [Priority]); `all`: every ready response.
  Status SendReady(double now, std::vector<Response>* out, bool all = false);
  void Resolve(std::vector<Response>* responses);
  // Worker: sends what was queued for rank 0 now.
  Status SendOutgoing();
  // Rank 0: sends `message` (a kShutdown) to every live worker and waits for their kAcks.
  void ShutDownWorkers(const std::vector<uint8_t>& message);

  ControlChannel* channel_;
  Config config_;
  ProcessSetInfo set_;
  int rank_;
  int size_;
  State state_ = State::kRunning;
  bool rank_zero_gone_ = false;
  Status halt_status_;
  ResponseCache cache_;
  Stats stats_;

  // Worker side.
  RequestMessage outgoing_;
  bool has_outgoing_ = false;
  std::unordered_map<std::string, Request> sent_;  // sent, response not yet received

  // Rank 0's side.
  std::unique_ptr<Negotiator> negotiator_;
  std::vector<bool> live_;          // workers that have not shut down
  std::vector<bool> awaiting_ack_;  // during our own shutdown
  FusionHold hold_;                 // Note [Dispatch]
  bool round_left_ = false;         // the last round left ready work behind (Note [Priority])
};

}  // namespace scaleout

#endif  // SCALEOUT_COORDINATOR_CONTROLLER_H_
