// The TCP star of Note [Liveness], as bytes and sockets: the frames ranks send each other, the
// invitation rank 0 hands every rank over MPI, rank 0's listening socket, a rank's connection
// to it, and sending a frame. What the frames mean, and when a peer counts as dead, is
// PeerLiveness's (runtime/peer_liveness.h).
#ifndef SCALEOUT_RUNTIME_LIVENESS_LINK_H_
#define SCALEOUT_RUNTIME_LIVENESS_LINK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace scaleout {
namespace liveness_link {

// Every message is one Frame; a connecting rank's first adds the job's secret.
constexpr uint32_t kMagic = 0x534f4c56;
enum Kind : uint32_t { kHello = 1, kWelcome = 2, kBeat = 3, kBye = 4, kGone = 5 };
struct Frame {
  uint32_t magic;
  uint32_t kind;
  // kHello: the sender; kWelcome: the receiver; kGone: the dead rank; kBeat from rank 0: the
  // first suspect of a stall, or -1 (Note [Stalls inside a collective])
  int32_t rank;
  // kGone: PeerLiveness::Cause; kBeat to rank 0: whether the sender is inside a collective;
  // kBeat from rank 0: the suspect's Suspicion
  int32_t cause;
  uint64_t progress;  // kBeat to rank 0: collectives the sender has started executing
};
constexpr size_t kSecretBytes = 16;
constexpr size_t kHelloBytes = sizeof(Frame) + kSecretBytes;
constexpr double kConnectSeconds = 2.0;
constexpr int kMaxAddresses = 8;
constexpr size_t kAddressBytes = 16;  // INET_ADDRSTRLEN, without the socket headers here
constexpr double kHandshakeSeconds = 5.0;

// What rank 0 sends every rank over MPI: where to connect and the secret that proves a
// connection comes from this job.
struct Invitation {
  int32_t ok;
  uint16_t port;
  uint8_t secret[kSecretBytes];
  char addresses[kMaxAddresses][kAddressBytes];
  char error[256];
};

// Rank 0's listening socket: on `interface`'s IPv4 address, or on every address (`addresses`
// then lists the up interfaces' ones, loopback last).
Status Listen(const std::string& interface, int* fd_out, uint16_t* port,
              std::vector<std::string>* addresses);
// Whether `events` came on fd within `seconds` (poll, retried on EINTR).
bool WaitFor(int fd, short events, double seconds);
// Connects to rank 0 at address:port and proves this rank belongs to the job; -1 and *why if not.
int Join(const std::string& address, uint16_t port, int rank, const uint8_t* secret,
         std::string* why);
// Sends one frame without blocking; a full socket buffer drops it.
void SendFrame(int fd, Kind kind, int32_t rank = 0, int32_t cause = 0, uint64_t progress = 0);

}  // namespace liveness_link
}  // namespace scaleout

#endif  // SCALEOUT_RUNTIME_LIVENESS_LINK_H_
