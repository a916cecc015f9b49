// Note [Endpoint servers]
// As in MLSL, communication can run on K "endpoint server" threads, each on a core reserved for
// it (scaleoutrun's placement reserves them and exports SCALEOUT_EP_CORES) and each with its own
// communicator, so that K transfers and reductions proceed at once and the compute cores are not
// interrupted. Server 0 is the coordinator thread itself; servers 1..K-1 are threads of this
// pool. A large buffer is split into K contiguous parts reduced concurrently, one per server.
// Every rank must use the same K (checked at init) so the parts line up.
//
// Threading: Run() is called by the coordinator thread only, one call at a time.
#ifndef SCALEOUT_COLLECTIVES_ENDPOINT_POOL_H_
#define SCALEOUT_COLLECTIVES_ENDPOINT_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"

namespace scaleout {

class EndpointPool {
 public:
  // k >= 1 servers; cores[i] (if present) is the CPU server i is pinned to.
  EndpointPool(int k, std::vector<int> cores);
  ~EndpointPool();
  EndpointPool(const EndpointPool&) = delete;
  EndpointPool& operator=(const EndpointPool&) = delete;

  int size() const { return k_; }
  // Pins the calling thread (the coordinator, server 0) to cores[0], if given.
  void PinServerZero() const;
  // Runs task(i) for every server i (task(0) on the calling thread) and waits for all.
  void Run(const std::function<void(int)>& task);
  // A buffer of `count` elements of `esize` bytes split across the servers: part(i, begin, end)
  // for server i's contiguous elements [begin, end), whole 64-byte lines each (the last takes
  // the remainder), all at once; or part(0, 0, count) on the calling thread when there is one
  // server or too few bytes for the hand-offs to pay. Returns the first failure.
  Status RunSplit(size_t count, size_t esize,
                  const std::function<Status(int, size_t, size_t)>& part);

 private:
  void Serve(int index);

  int k_;
  std::vector<int> cores_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  unsigned long generation_ = 0;
  int remaining_ = 0;
  bool stop_ = false;
};

// Pins the calling thread to one CPU; false if the OS refused.
bool PinCurrentThread(int cpu);

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_ENDPOINT_POOL_H_
