// Note [Liveness]
// Whatever started the ranks (scaleoutrun, plain mpiexec, srun, an MPI operator), a rank that
// dies must end its peers' collectives with an error naming it, not a hang: the launcher may
// leave the survivors running (mpiexec -disable-auto-cleanup, some operators do), and MPI
// itself says nothing: measured with MPICH 5 over UCX, a blocking collective with a dead peer
// waits forever, a nonblocking one stays pending, and a send to the dead peer can crash the
// sender. So deaths are found outside MPI, by a thread of their own in every rank:
//  - Over TCP, in a star around rank 0: at init rank 0 listens, each other rank connects and
//    proves it belongs to the job (a random secret rank 0 sent over MPI). A process that dies
//    has its sockets closed by its kernel, so its peer reads end-of-file at once; a clean
//    shutdown says goodbye first. Both ends send a heartbeat every second, and a peer silent
//    for SCALEOUT_HEARTBEAT_TIMEOUT_SECONDS (a machine or link gone, a stopped process) counts
//    as dead too. Rank 0 tells every other rank of each death it finds, so every rank learns
//    of every death (networked() is true).
//  - By process: a peer on this machine (and pid namespace) whose process is gone. This alone
//    remains where the TCP star cannot be set up (every rank then agrees to do without it, and
//    rank 0 says why); deaths then reach the other ranks through rank 0's negotiation.
// What a death ends: the coordinator stops negotiating and fails every pending and later
// collective naming the dead rank (with its pid and host), and a rank waiting inside a
// data-plane collective gives up on it (Interruption()), so nothing waits on a dead peer.
//
// Note [Stalls inside a collective]
// A rank can also stay alive and stuck: stopped with its heartbeat timeout off, or alive but
// never entering the collective the others wait inside. The coordinator thread is then inside
// the transfer and cannot report anything, so this thread does: the coordinator marks each
// response it executes (Execution), the heartbeats carry how many each rank has started and
// whether it is inside one, and once this rank has been inside one collective for
// SCALEOUT_STALL_CHECK_TIME_SECONDS it warns, naming the ranks not heard from lately and those
// that have not reached the collective yet (rank 0 knows every rank's count; it sends the
// others the first suspect with its heartbeats).
#ifndef SCALEOUT_RUNTIME_PEER_LIVENESS_H_
#define SCALEOUT_RUNTIME_PEER_LIVENESS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "mpi/so_mpi.h"

namespace scaleout {

class PeerLiveness {
 public:
  struct Options {
    double heartbeat_timeout_seconds = 30;  // 0: only deaths the kernel reports
    std::string interface;                  // rank 0 listens there only (empty: everywhere)
    double stall_seconds = 60;              // Note [Stalls inside a collective]; 0: off
  };

  // What the coordinator thread is executing (Note [Stalls inside a collective]).
  class Execution {
   public:
    // `collective` (a name that outlives the call, as CollectiveName's) of `tensors` tensors,
    // the first named `first`. Only copied here: the text is made when a stall is reported
    // (formatting it took a 4 KiB allreduce 0.3 us).
    void Begin(const char* collective, const std::string& first, size_t tensors, double now);
    void End() { inside_.store(false, std::memory_order_release); }

   private:
    friend class PeerLiveness;
    // "allreduce 'x' (and 3 fused with it)"; under mu_.
    std::string WhatLocked() const;

    std::atomic<uint64_t> started_{0};
    std::atomic<bool> inside_{false};
    std::mutex mu_;
    const char* collective_ = "";  // guarded by mu_, as the rest
    std::string first_;
    size_t tensors_ = 0;
    double since_ = 0;
  };
  Execution& execution() { return execution_; }

  // Collective over `comm`; `local` groups the ranks of this machine (MPI_COMM_TYPE_SHARED).
  // Fails only when MPI does; a TCP star that cannot be set up is logged and done without.
  static Status Create(so_mpi_handle comm, so_mpi_handle local, const Options& options,
                       std::unique_ptr<PeerLiveness>* out);
  ~PeerLiveness();
  PeerLiveness(const PeerLiveness&) = delete;
  PeerLiveness& operator=(const PeerLiveness&) = delete;

  // Stops watching and tells the peers this rank shut down (it did not die). Idempotent; after
  // the coordinator has stopped.
  void Stop();

  // Thread-safe, cheap: whether any peer is known dead.
  bool AnyDead() const { return dead_count_.load(std::memory_order_acquire) > 0; }
  // Why `rank` is known dead ("rank 3 (pid 4242 on node7) died: ..."), or "" while it is not.
  std::string DeathOf(int rank) const;
  // OK, or ShutDown naming the first peer found dead: for waits in the data plane.
  Status Interruption() const;
  // The first peer found dead, or -1.
  int FirstDead() const;
  // Every death found anywhere reaches every rank (the TCP star is up).
  bool networked() const { return networked_; }
  // "rank 3 (pid 4242 on node7)"
  std::string Describe(int rank) const;
  int size() const { return static_cast<int>(peers_.size()); }

  // Whether this process has seen a peer die since it started (any runtime): MPI_Finalize would
  // wait for the dead peer forever, so it must be skipped. Process-wide on purpose: it outlives
  // the runtime that found the death, up to the interpreter's exit.
  static bool LostAPeer();

 private:
  struct Peer {
    int64_t pid = 0;
    uint64_t pid_namespace = 0;
    int64_t machine = 0;  // world rank of the first rank on its machine
    std::string host;
  };
  // A TCP connection to one peer (rank 0: to each other rank; others: to rank 0).
  struct Link {
    int fd = -1;
    int rank = -1;  // -1 until a connecting rank has proved itself (rank 0 only)
    double last_heard = 0;
    double accepted_at = 0;  // rank 0: when the unproven connection came
    bool said_bye = false;
    uint64_t started = 0;  // rank 0: collectives the peer has started executing
    bool inside = false;   // rank 0: whether it is executing one
    std::vector<uint8_t> inbox;
  };
  enum class Cause { kExited = 1, kSilent = 2 };

  PeerLiveness() = default;
  bool Watched(int rank) const;  // by process: same machine and pid namespace
  void Run();
  void Accept(double now);
  void Read(Link* link, double now);
  bool Handshake(Link* link, double now);
  void Beat(double now);
  void MarkDead(int rank, Cause cause);
  void CheckStall(double now);
  // Rank 0: who keeps the collective being executed waiting ("" if nobody stands out), and the
  // first of them for the other ranks.
  std::string Suspects(double now, uint64_t started, int* first, int* kind) const;
  void Drop(Link* link);

  std::vector<Peer> peers_;
  int self_ = 0;
  Options options_;
  bool networked_ = false;
  uint8_t secret_[16] = {0};

  // Owned by the thread once it runs.
  int listener_ = -1;  // rank 0, until every rank has connected
  std::vector<Link> links_;
  int connected_ = 0;  // rank 0: ranks that proved themselves
  double last_beat_ = 0;
  double last_process_check_ = 0;
  Execution execution_;
  uint64_t stall_reported_ = 0;  // the collective (by count) last warned about
  int suspect_ = -1;             // from rank 0's heartbeats (other ranks)
  int suspect_kind_ = 0;

  std::thread thread_;
  int wake_[2] = {-1, -1};  // a pipe: Stop() writes, the thread polls
  std::atomic<bool> stop_{false};
  std::atomic<bool> keep_links_{true};  // false: the star was given up at init

  mutable std::mutex mu_;
  std::vector<std::string> deaths_;  // guarded by mu_; "" while alive
  int first_dead_ = -1;              // guarded by mu_
  std::atomic<int> dead_count_{0};
};

}  // namespace scaleout

#endif  // SCALEOUT_RUNTIME_PEER_LIVENESS_H_
