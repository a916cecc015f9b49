#include "coordinator/response_cache.h"

namespace scaleout {

ResponseCache::ResponseCache(int capacity, int world_size)
    : capacity_(capacity < 0 ? 0 : capacity), world_size_(world_size) {}

bool ResponseCache::Cacheable(int32_t collective) {
  return collective == SO_ALLREDUCE || collective == SO_ALLGATHER || collective == SO_BROADCAST ||
         collective == SO_REDUCESCATTER;
}

int ResponseCache::Lookup(const std::string& name) const {
  auto it = slots_.find(name);
  return it == slots_.end() ? -1 : it->second;
}

const std::string& ResponseCache::NameOf(int slot) const {
  SO_CHECK(slot >= 0 && slot < static_cast<int>(names_.size()) && !names_[slot].empty(),
           "unknown response-cache slot " + std::to_string(slot));
  return names_[slot];
}

int ResponseCache::Assign(const std::string& name) {
  int existing = Lookup(name);
  if (existing >= 0) return existing;
  if (size() >= capacity_) return -1;
  const int slot = size();
  Record(slot, name);
  return slot;
}

// Fusion may put a later slot's tensor before an earlier one in a response list, so slots can
// arrive out of order; each is recorded where it belongs.
void ResponseCache::Record(int slot, const std::string& name) {
  SO_CHECK(slot >= 0 && slot < (capacity_ > 0 ? capacity_ : 1) + 1000000, "implausible cache slot");
  if (slot >= static_cast<int>(names_.size())) {
    names_.resize(slot + 1);
    params_.resize(slot + 1, std::vector<Request>(world_size_));
    has_params_.resize(slot + 1, std::vector<bool>(world_size_, false));
  }
  SO_CHECK(names_[slot].empty(), "cache slot " + std::to_string(slot) + " assigned twice");
  names_[slot] = name;
  slots_[name] = slot;
  ++assigned_;
}

const Request* ResponseCache::Params(int slot, int rank) const {
  if (slot < 0 || slot >= static_cast<int>(names_.size()) || !has_params_[slot][rank])
    return nullptr;
  return &params_[slot][rank];
}

void ResponseCache::SetParams(int slot, int rank, const Request& params) {
  SO_CHECK(slot >= 0 && slot < static_cast<int>(names_.size()), "unknown response-cache slot");
  params_[slot][rank] = params;
  has_params_[slot][rank] = true;
}

}  // namespace scaleout
