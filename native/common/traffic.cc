#include "common/traffic.h"

#include <atomic>

namespace scaleout {
namespace traffic {

// Note [Traffic]
// Every collective the executor runs sets its thread's kind (the endpoint servers take their
// caller's for the parts they run), counts one call and the bytes this rank submitted, and the
// layers below add to that kind what they do: the MPI transport the bytes this rank hands MPI
// to send (its payload; what MPI's algorithm puts on the wire can be more) and the time it waits
// for MPI; the staged algorithms the bytes this rank writes into its staging areas for the
// others to read, the time in Sync, and the time in the reduction kernels they run. Always on:
// a few relaxed atomic adds and clock reads per collective and per 64 KiB block reduced.
namespace {
std::atomic<int64_t> counters[SO_COLLECTIVE_COUNT][SO_TRAFFIC_COUNT];
thread_local int kind = -1;
}  // namespace

void SetKind(int collective) { kind = collective; }

int Kind() { return kind; }

void Add(Field field, int64_t value) {
  if (kind < 0 || kind >= SO_COLLECTIVE_COUNT) return;
  counters[kind][field].fetch_add(value, std::memory_order_relaxed);
}

void Read(int64_t* out) {
  for (int c = 0; c < SO_COLLECTIVE_COUNT; ++c) {
    for (int f = 0; f < SO_TRAFFIC_COUNT; ++f) {
      out[c * SO_TRAFFIC_COUNT + f] = counters[c][f].load(std::memory_order_relaxed);
    }
  }
}

void Reset() {
  for (auto& row : counters) {
    for (auto& c : row) c.store(0, std::memory_order_relaxed);
  }
}

}  // namespace traffic
}  // namespace scaleout
