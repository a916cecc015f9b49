// Note [Response cache]
// Training repeats the same named collectives every step. Once a name has been agreed, rank 0
// gives it a slot, and every rank learns the slot from the response that
// created it. Afterwards a rank whose request has the same parameters as the last one it sent for
// that name sends only the slot number (4 bytes instead of the name and parameters), and the
// rank 0 sends the slot instead of the name back. Slots are never reassigned (when the cache
// is full, new names simply travel in full), and a rank's cached parameters change only when it
// sends that name in full again; since a rank never has the same name in flight twice and
// control messages between two ranks arrive in order, the coordinator always resolves a slot to
// exactly the parameters the sender meant.
#ifndef SCALEOUT_COORDINATOR_RESPONSE_CACHE_H_
#define SCALEOUT_COORDINATOR_RESPONSE_CACHE_H_

#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/message.h"

namespace scaleout {

// Not thread-safe: owned by the coordinator thread.
class ResponseCache {
 public:
  ResponseCache(int capacity, int world_size);

  static bool Cacheable(int32_t collective);
  int capacity() const { return capacity_; }
  int size() const { return assigned_; }  // slots in use

  int Lookup(const std::string& name) const;  // the slot, or -1
  const std::string& NameOf(int slot) const;
  // Rank 0: gives `name` the next free slot; -1 when the cache is full or disabled.
  int Assign(const std::string& name);
  // Other ranks: records the slot the coordinator assigned.
  void Record(int slot, const std::string& name);

  // The parameters `rank` last sent for the slot's name (nullptr if none).
  const Request* Params(int slot, int rank) const;
  void SetParams(int slot, int rank, const Request& params);

 private:
  int capacity_;
  int world_size_;
  int assigned_ = 0;
  std::vector<std::string> names_;  // by slot; empty where not (yet) known
  std::unordered_map<std::string, int> slots_;
  std::vector<std::vector<Request>> params_;   // [slot][rank]
  std::vector<std::vector<bool>> has_params_;  // [slot][rank]
};

}  // namespace scaleout

#endif  // SCALEOUT_COORDINATOR_RESPONSE_CACHE_H_
