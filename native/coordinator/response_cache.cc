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
  SO_CHECK(slot >= 0 && slot < size(), "unknown response-cache slot " + std::to_string(slot));
  return names_[slot];
}

int ResponseCache::Assign(const std::string& name) {
  int existing = Lookup(name);
  if (existing >= 0) return existing;
  if (size() >= capacity_) return -1;
  Record(size(), name);
  return size() - 1;
}

void ResponseCache::Record(int slot, const std::string& name) {
  SO_CHECK(slot == size(), "response-cache slots must arrive in order (got " +
                               std::to_string(slot) + ", expected " + std::to_string(size()) + ")");
  names_.push_back(name);
  slots_[name] = slot;
  params_.emplace_back(world_size_);
  has_params_.emplace_back(world_size_, false);
}

const Request* ResponseCache::Params(int slot, int rank) const {
  if (slot < 0 || slot >= size() || !has_params_[slot][rank]) return nullptr;
  return &params_[slot][rank];
}

void ResponseCache::SetParams(int slot, int rank, const Request& params) {
  SO_CHECK(slot >= 0 && slot < size(), "unknown response-cache slot");
  params_[slot][rank] = params;
  has_params_[slot][rank] = true;
}

}  // namespace scaleout
