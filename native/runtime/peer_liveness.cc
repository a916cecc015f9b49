#include "runtime/peer_liveness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <sstream>

#include "common/logging.h"
#include "common/process.h"
#include "runtime/liveness_link.h"
#include "transport/mpi/mpi_api.h"

namespace scaleout {

using namespace liveness_link;  // the TCP star's wire; this file is the policy over it

namespace {

enum Suspicion : int32_t { kBehind = 1, kQuiet = 2 };
constexpr double kQuietSeconds = 3.0;  // three heartbeats missed

constexpr double kBeatSeconds = 1.0;
constexpr double kPollSeconds = 0.25;
constexpr double kProcessCheckSeconds = 0.25;
constexpr int kHostBytes = 64;

std::atomic<bool> g_lost_a_peer{false};  // PeerLiveness::LostAPeer

double Now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Status PeerLiveness::Create(so_mpi_handle comm, so_mpi_handle local, const Options& options,
                            std::unique_ptr<PeerLiveness>* out) {
  const so_mpi_api& mpi = Mpi();
  int rank = 0, size = 1;
  mpi.comm_rank(comm, &rank);
  mpi.comm_size(comm, &size);
  int64_t machine = rank;
  int rc = mpi.allreduce(nullptr, &machine, 1, SO_MPI_INT64, SO_MPI_MIN, local);
  if (rc != 0) return MpiError("MPI_Allreduce", rc);
  struct Record {
    int64_t pid, pid_namespace, machine;
    char host[kHostBytes];
  };
  Record mine{static_cast<int64_t>(::getpid()), static_cast<int64_t>(PidNamespace()), machine, {0}};
  ::gethostname(mine.host, kHostBytes - 1);
  std::vector<Record> all(size);
  rc = mpi.allgather(&mine, sizeof(Record), SO_MPI_BYTE, all.data(), comm);
  if (rc != 0) return MpiError("MPI_Allgather", rc);
  std::unique_ptr<PeerLiveness> p(new PeerLiveness());
  p->self_ = rank;
  p->options_ = options;
  p->peers_.resize(size);
  for (int r = 0; r < size; ++r) {
    p->peers_[r] = Peer{all[r].pid, static_cast<uint64_t>(all[r].pid_namespace), all[r].machine,
                        std::string(all[r].host, strnlen(all[r].host, kHostBytes))};
  }
  p->deaths_.assign(size, std::string());
  if (size == 1) {
    *out = std::move(p);
    return Status::OK();
  }
  if (::pipe2(p->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status::Transport(SystemError("pipe", errno));
  }

  // The star: rank 0 listens and answers from its thread while the others connect.
  Invitation invitation{};
  if (rank == 0) {
    std::random_device random;
    for (uint8_t& b : p->secret_) b = static_cast<uint8_t>(random());
    std::vector<std::string> addresses;
    Status s = Listen(options.interface, &p->listener_, &invitation.port, &addresses);
    invitation.ok = s.ok() ? 1 : 0;
    if (!s.ok()) std::strncpy(invitation.error, s.message().c_str(), sizeof(invitation.error) - 1);
    std::memcpy(invitation.secret, p->secret_, kSecretBytes);
    for (size_t i = 0; i < addresses.size(); ++i) {
      std::strncpy(invitation.addresses[i], addresses[i].c_str(), INET_ADDRSTRLEN - 1);
    }
    p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  }
  rc = mpi.bcast(&invitation, sizeof(invitation), SO_MPI_BYTE, 0, comm);
  if (rc != 0) return MpiError("MPI_Bcast", rc);
  int32_t ok = invitation.ok;
  std::string failure;
  int fd = -1;
  if (rank != 0 && ok) {
    std::memcpy(p->secret_, invitation.secret, kSecretBytes);
    const bool beside_zero = p->peers_[0].machine == p->peers_[rank].machine;
    std::vector<std::string> tries;
    for (const auto& a : invitation.addresses) {
      const std::string address(a, strnlen(a, INET_ADDRSTRLEN));
      if (address.empty()) continue;
      const bool loopback = address.rfind("127.", 0) == 0;
      if (loopback && beside_zero) tries.insert(tries.begin(), address);
      if (!loopback) tries.push_back(address);
    }
    for (const std::string& address : tries) {
      std::string why;
      fd = Join(address, invitation.port, rank, p->secret_, &why);
      if (fd >= 0) break;
      failure += (failure.empty() ? "" : "; ") + why;
    }
    if (fd < 0) {
      ok = 0;
      failure = "rank " + std::to_string(rank) + " could not reach rank 0 (on " +
                p->peers_[0].host + ")" +
                (failure.empty() ? std::string(": it listens on no address") : ": " + failure);
    }
  }
  std::vector<int32_t> oks(size);
  rc = mpi.allgather(&ok, 1, SO_MPI_INT32, oks.data(), comm);
  if (rc != 0) return MpiError("MPI_Allgather", rc);
  std::string missing;
  for (int r = 1; r < size; ++r) {
    if (!oks[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (invitation.ok && missing.empty()) {
    p->networked_ = true;
    if (rank != 0) {
      Link zero;
      zero.fd = fd;
      zero.rank = 0;
      zero.last_heard = Now();
      p->links_.push_back(std::move(zero));
    }
  } else {
    p->keep_links_.store(false);
    if (fd >= 0) ::close(fd);
    if (!failure.empty()) SO_LOG(kWarning, failure);
    if (rank == 0) {
      SO_LOG(kWarning, "ranks on other machines cannot tell when a peer dies ("
                           << (invitation.ok ? "ranks " + missing + " could not connect to rank 0"
                                             : std::string(invitation.error))
                           << "): a rank that dies ends the job only through the launcher");
    }
  }
  if (rank != 0) p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  *out = std::move(p);
  return Status::OK();
}

PeerLiveness::~PeerLiveness() {
  Stop();
  for (int& fd : wake_) {
    if (fd >= 0) ::close(fd);
  }
}

void PeerLiveness::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  const char byte = 1;
  (void)::write(wake_[1], &byte, 1);
  thread_.join();
}

bool PeerLiveness::Watched(int rank) const {
  if (rank == self_ || rank < 0 || rank >= size()) return false;
  const Peer& me = peers_[self_];
  const Peer& p = peers_[rank];
  return p.machine == me.machine && p.pid_namespace != 0 && p.pid_namespace == me.pid_namespace;
}

std::string PeerLiveness::Describe(int rank) const {
  std::string s = "rank " + std::to_string(rank);
  if (rank >= 0 && rank < size()) {
    s += " (pid " + std::to_string(peers_[rank].pid) + " on " + peers_[rank].host + ")";
  }
  return s;
}

std::string PeerLiveness::DeathOf(int rank) const {
  if (!AnyDead() || rank < 0 || rank >= size()) return std::string();
  std::lock_guard<std::mutex> lock(mu_);
  return deaths_[rank];
}

Status PeerLiveness::Interruption() const {
  if (!AnyDead()) return Status::OK();
  std::lock_guard<std::mutex> lock(mu_);
  return Status::ShutDown(deaths_[first_dead_]).WithCulprits({first_dead_});
}

int PeerLiveness::FirstDead() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_dead_;
}

bool PeerLiveness::LostAPeer() { return g_lost_a_peer.load(); }

void PeerLiveness::MarkDead(int rank, Cause cause) {
  if (rank < 0 || rank >= size() || rank == self_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!deaths_[rank].empty()) return;
    std::string why = Describe(rank);
    if (cause == Cause::kExited) {
      why += " died: its process ended without shutting scaleout down";
    } else {
      std::ostringstream seconds;
      seconds << options_.heartbeat_timeout_seconds;
      why += " stopped answering: nothing was heard from it for " + seconds.str() +
             " s (SCALEOUT_HEARTBEAT_TIMEOUT_SECONDS); its machine or network is down, or the "
             "process is stopped";
    }
    deaths_[rank] = why;
    if (first_dead_ < 0) first_dead_ = rank;
  }
  g_lost_a_peer.store(true);
  dead_count_.fetch_add(1, std::memory_order_release);
  if (self_ != 0) return;
  for (Link& link : links_) {  // rank 0 tells everyone else
    if (link.fd >= 0 && link.rank > 0 && link.rank != rank) {
      SendFrame(link.fd, kGone, rank, static_cast<int32_t>(cause));
    }
  }
}

void PeerLiveness::Drop(Link* link) {
  if (link->fd >= 0) ::close(link->fd);
  link->fd = -1;
}

void PeerLiveness::Run() {
  while (!stop_.load()) {
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}};
    if (listener_ >= 0) fds.push_back({listener_, POLLIN, 0});
    const size_t first_link = fds.size();
    for (const Link& link : links_) fds.push_back({link.fd, POLLIN, 0});
    const int rc = ::poll(fds.data(), fds.size(), static_cast<int>(kPollSeconds * 1000));
    if (stop_.load()) break;
    const double now = Now();
    if (!keep_links_.load()) {  // the star was given up at init
      if (listener_ >= 0) ::close(listener_);
      listener_ = -1;
      for (Link& link : links_) Drop(&link);
    }
    if (rc > 0) {
      const size_t known = links_.size();  // Accept may add to links_
      for (size_t i = 0; i < known; ++i) {
        if (links_[i].fd >= 0 && fds[first_link + i].revents != 0) Read(&links_[i], now);
      }
      if (listener_ >= 0 && fds[1].revents != 0) Accept(now);
    }
    Beat(now);
    CheckStall(now);
    links_.erase(
        std::remove_if(links_.begin(), links_.end(), [](const Link& l) { return l.fd < 0; }),
        links_.end());
    if (now - last_process_check_ >= kProcessCheckSeconds) {
      last_process_check_ = now;
      for (int r = 0; r < size(); ++r) {
        if (Watched(r) && DeathOf(r).empty() && ProcessGone(static_cast<pid_t>(peers_[r].pid))) {
          MarkDead(r, Cause::kExited);
        }
      }
    }
  }
  // Shut down: not a death.
  for (Link& link : links_) {
    if (link.fd >= 0 && link.rank >= 0) SendFrame(link.fd, kBye);
    Drop(&link);
  }
  links_.clear();
  if (listener_ >= 0) ::close(listener_);
  listener_ = -1;
}

void PeerLiveness::Accept(double now) {
  for (;;) {
    int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Link link;
    link.fd = fd;
    link.last_heard = link.accepted_at = now;
    links_.push_back(std::move(link));
  }
}

void PeerLiveness::Read(Link* link, double now) {
  bool closed = false;
  uint8_t buf[512];
  for (;;) {
    ssize_t n = ::recv(link->fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      link->inbox.insert(link->inbox.end(), buf, buf + n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    closed = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    break;
  }
  if (link->rank < 0 && !Handshake(link, now)) {
    if (closed) Drop(link);
    return;
  }
  size_t used = 0;
  while (link->inbox.size() - used >= sizeof(Frame)) {
    Frame f;
    std::memcpy(&f, link->inbox.data() + used, sizeof(f));
    used += sizeof(f);
    if (f.magic != kMagic) {
      closed = true;
      break;
    }
    link->last_heard = now;
    if (f.kind == kBye) link->said_bye = true;
    if (f.kind == kBeat && self_ == 0) {
      link->started = f.progress;
      link->inside = f.cause != 0;
    } else if (f.kind == kBeat) {
      suspect_ = f.rank;
      suspect_kind_ = f.cause;
    }
    if (f.kind == kGone && self_ != 0) MarkDead(f.rank, static_cast<Cause>(f.cause));
  }
  link->inbox.erase(link->inbox.begin(), link->inbox.begin() + static_cast<std::ptrdiff_t>(used));
  if (!closed) return;
  if (!link->said_bye) MarkDead(link->rank, Cause::kExited);
  Drop(link);
}

// Rank 0: a connection's first bytes must be a hello from a rank not yet connected, with the
// job's secret; anything else is closed. Returns whether the link is now a rank's.
bool PeerLiveness::Handshake(Link* link, double now) {
  if (link->inbox.size() < kHelloBytes) return false;
  Frame f;
  std::memcpy(&f, link->inbox.data(), sizeof(f));
  const bool known =
      std::any_of(links_.begin(), links_.end(), [&](const Link& l) { return l.rank == f.rank; });
  if (f.magic != kMagic || f.kind != kHello || f.rank <= 0 || f.rank >= size() || known ||
      std::memcmp(link->inbox.data() + sizeof(f), secret_, kSecretBytes) != 0) {
    Drop(link);
    return false;
  }
  link->inbox.erase(link->inbox.begin(), link->inbox.begin() + kHelloBytes);
  link->rank = f.rank;
  link->last_heard = now;
  SendFrame(link->fd, kWelcome, f.rank);
  if (++connected_ == size() - 1) {  // everyone is here: nobody else may connect
    ::close(listener_);
    listener_ = -1;
  }
  return true;
}

void PeerLiveness::Beat(double now) {
  const bool beat = now - last_beat_ >= kBeatSeconds;
  if (beat) last_beat_ = now;
  const uint64_t started = execution_.started_.load(std::memory_order_acquire);
  const bool inside = execution_.inside_.load(std::memory_order_acquire);
  int suspect = -1, kind = 0;
  if (beat && self_ == 0 && inside) Suspects(now, started, &suspect, &kind);
  const double timeout = options_.heartbeat_timeout_seconds;
  for (Link& link : links_) {
    if (link.fd < 0) continue;
    if (link.rank < 0) {  // a connection that has not proved itself in time
      if (now - link.accepted_at > kHandshakeSeconds) Drop(&link);
      continue;
    }
    if (timeout > 0 && now - link.last_heard > timeout) {
      MarkDead(link.rank, Cause::kSilent);
      Drop(&link);
      continue;
    }
    if (!beat) continue;
    if (self_ == 0) {
      SendFrame(link.fd, kBeat, suspect, kind);
    } else {
      SendFrame(link.fd, kBeat, self_, inside ? 1 : 0, started);
    }
  }
}

void PeerLiveness::Execution::Begin(const char* collective, const std::string& first,
                                    size_t tensors, double now) {
  std::lock_guard<std::mutex> lock(mu_);
  collective_ = collective;
  first_ = first;  // the capacity of the last name is reused
  tensors_ = tensors;
  since_ = now;
  started_.fetch_add(1, std::memory_order_release);
  inside_.store(true, std::memory_order_release);
}

std::string PeerLiveness::Execution::WhatLocked() const {
  std::string what = collective_;
  if (tensors_ > 0) what += " '" + first_ + "'";
  if (tensors_ > 1) what += " (and " + std::to_string(tensors_ - 1) + " fused with it)";
  return what;
}

std::string PeerLiveness::Suspects(double now, uint64_t started, int* first, int* kind) const {
  std::string quiet, behind;
  auto add = [](std::string* list, int rank) {
    *list += (list->empty() ? "" : ", ") + std::to_string(rank);
  };
  double longest = 0;
  for (const Link& link : links_) {
    if (link.fd < 0 || link.rank < 0) continue;
    if (now - link.last_heard > kQuietSeconds) {
      add(&quiet, link.rank);
      longest = std::max(longest, now - link.last_heard);
      if (*first < 0 || *kind != kQuiet) *first = link.rank, *kind = kQuiet;
    } else if (link.started < started) {
      add(&behind, link.rank);
      if (*first < 0) *first = link.rank, *kind = kBehind;
    }
  }
  std::string out;
  if (!quiet.empty()) {
    out = "not heard from rank(s) " + quiet + " for " + std::to_string(static_cast<int>(longest)) +
          " s (stopped, or its machine or network is down)";
  }
  if (!behind.empty()) {
    out +=
        (out.empty() ? "" : "; ") + std::string("rank(s) ") + behind + " have not reached it yet";
  }
  return out;
}

void PeerLiveness::CheckStall(double now) {
  if (options_.stall_seconds <= 0 || !execution_.inside_.load(std::memory_order_acquire)) return;
  std::string what;
  double since;
  uint64_t started;
  {
    std::lock_guard<std::mutex> lock(execution_.mu_);  // Begin's too: as short as can be
    since = execution_.since_;
    started = execution_.started_.load(std::memory_order_acquire);
    if (now - since < options_.stall_seconds || stall_reported_ == started) return;
    what = execution_.WhatLocked();  // formatted only for a report
  }
  stall_reported_ = started;
  std::string who;
  int first = -1, kind = 0;
  if (self_ == 0) {
    who = Suspects(now, started, &first, &kind);
  } else if (!links_.empty() && now - links_[0].last_heard > kQuietSeconds) {
    who = "not heard from rank 0 for " +
          std::to_string(static_cast<int>(now - links_[0].last_heard)) + " s";
  } else if (suspect_ >= 0) {
    const std::string whom = suspect_ == self_ ? "this rank" : "rank " + std::to_string(suspect_);
    who = "rank 0 says " + whom +
          (suspect_kind_ == kQuiet ? " has not been heard from lately" : " has not reached it yet");
  }
  SO_LOG(kWarning, what << " has been executing on this rank for " << static_cast<int>(now - since)
                        << " s: "
                        << (who.empty() ? "every rank is inside it and answering: the "
                                          "transfer itself is stuck or slow"
                                        : who));
}

}  // namespace scaleout
