#include "runtime/liveness_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace scaleout {
namespace liveness_link {

static_assert(kAddressBytes == INET_ADDRSTRLEN, "an IPv4 address's text");

// Rank 0's listening socket: on `interface`'s IPv4 address, or on every address (`addresses`
// then lists the up interfaces' ones, loopback last).
Status Listen(const std::string& interface, int* fd_out, uint16_t* port,
              std::vector<std::string>* addresses) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return Status::Transport(SystemError("getifaddrs", errno));
  std::vector<std::string> outside, loopback;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP))
      continue;
    if (!interface.empty() && interface != a->ifa_name) continue;
    char text[INET_ADDRSTRLEN] = {0};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                sizeof(text));
    ((a->ifa_flags & IFF_LOOPBACK) ? loopback : outside).push_back(text);
  }
  ::freeifaddrs(list);
  if (!interface.empty() && outside.empty() && loopback.empty()) {
    return Status::InvalidArgument("SCALEOUT_NETWORK_INTERFACE names " + interface +
                                   ", which is not an up interface with an IPv4 address here");
  }
  *addresses = outside;
  addresses->insert(addresses->end(), loopback.begin(), loopback.end());
  if (addresses->size() > static_cast<size_t>(kMaxAddresses)) addresses->resize(kMaxAddresses);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::Transport(SystemError("socket", errno));
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = 0;
  at.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!interface.empty()) ::inet_pton(AF_INET, (*addresses)[0].c_str(), &at.sin_addr);
  socklen_t len = sizeof(at);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0 || ::listen(fd, 4096) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&at), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::Transport(SystemError("listening for the other ranks", err));
  }
  *fd_out = fd;
  *port = ntohs(at.sin_port);
  return Status::OK();
}

bool WaitFor(int fd, short events, double seconds) {
  pollfd p{fd, events, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, static_cast<int>(seconds * 1000));
  } while (rc < 0 && errno == EINTR);
  return rc > 0 && (p.revents & events);
}

// Connects to rank 0 at address:port and proves this rank belongs to the job; -1 and *why if not.
int Join(const std::string& address, uint16_t port, int rank, const uint8_t* secret,
         std::string* why) {
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(port);
  if (::inet_pton(AF_INET, address.c_str(), &at.sin_addr) != 1) {
    *why = address + " is not an IPv4 address";
    return -1;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *why = SystemError("socket", errno);
    return -1;
  }
  auto fail = [&](const std::string& what) {
    *why = address + ":" + std::to_string(port) + ": " + what;
    ::close(fd);
    return -1;
  };
  if (::connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0 && errno != EINPROGRESS) {
    return fail(std::strerror(errno));
  }
  if (!WaitFor(fd, POLLOUT, kConnectSeconds)) return fail("no connection within 2 s");
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return fail(std::strerror(err));
  uint8_t hello[kHelloBytes];
  const Frame f{kMagic, kHello, rank, 0, 0};
  std::memcpy(hello, &f, sizeof(f));
  std::memcpy(hello + sizeof(f), secret, kSecretBytes);
  if (::send(fd, hello, sizeof(hello), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(hello))) {
    return fail(std::strerror(errno));
  }
  Frame welcome{};
  size_t got = 0;
  while (got < sizeof(welcome)) {
    if (!WaitFor(fd, POLLIN, kHandshakeSeconds)) return fail("no answer within 5 s");
    ssize_t n = ::recv(fd, reinterpret_cast<uint8_t*>(&welcome) + got, sizeof(welcome) - got, 0);
    if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) {
      return fail("closed by the other side (not this job's rank 0)");
    }
    if (n > 0) got += static_cast<size_t>(n);
  }
  if (welcome.magic != kMagic || welcome.kind != kWelcome || welcome.rank != rank) {
    return fail("not this job's rank 0");
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

void SendFrame(int fd, Kind kind, int32_t rank, int32_t cause, uint64_t progress) {
  // A few bytes into an almost empty socket buffer: all or nothing. A full buffer (a peer that
  // has stopped reading) drops the frame, as its silence is found anyway.
  const Frame f{kMagic, kind, rank, cause, progress};
  (void)::send(fd, &f, sizeof(f), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace liveness_link
}  // namespace scaleout
