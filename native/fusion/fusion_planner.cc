#include "fusion/fusion_planner.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace scaleout {
namespace {

bool Fusable(const Response& r) {
  return !r.is_error() && (r.collective == SO_ALLREDUCE || r.collective == SO_ALLGATHER);
}

using FusionKey = std::tuple<int32_t, int32_t, int32_t, double, double, std::vector<int32_t>>;

FusionKey KeyOf(const Response& r) {
  return {r.collective,
          static_cast<int32_t>(r.dtype),
          static_cast<int32_t>(r.reduce_op),
          r.prescale,
          r.postscale,
          r.joined_ranks};
}

}  // namespace

size_t FusedBytes(const Response& response, const ResponseTensor& t) {
  const size_t esize = IsHalf(response.dtype) ? sizeof(float) : DataTypeSize(response.dtype);
  if (response.collective == SO_ALLGATHER) {
    size_t row = 1;
    for (size_t i = 1; i < t.shape.size(); ++i) row *= static_cast<size_t>(t.shape[i]);
    size_t rows = 0;
    for (int64_t d : t.first_dims) rows += static_cast<size_t>(d);
    return rows * row * esize;
  }
  if (t.is_part()) return static_cast<size_t>(t.part_count) * esize;
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  return n * esize;
}

std::vector<Response> PlanFusion(std::vector<Response> ready, size_t threshold_bytes) {
  if (ready.size() < 2) return ready;  // nothing to fuse (the common case of a lone tensor)
  std::vector<Response> out;
  out.reserve(ready.size());
  std::map<FusionKey, std::pair<size_t, size_t>> open;  // key -> (index in out, bytes so far)
  for (Response& r : ready) {
    if (!Fusable(r) || threshold_bytes == 0) {
      out.push_back(std::move(r));
      continue;
    }
    const size_t bytes = FusedBytes(r, r.tensors[0]);
    FusionKey key = KeyOf(r);
    auto it = open.find(key);
    if (it != open.end() && it->second.second + bytes <= threshold_bytes) {
      out[it->second.first].tensors.push_back(std::move(r.tensors[0]));
      it->second.second += bytes;
      continue;
    }
    open[key] = {out.size(), bytes};
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

// An allreduce of one whole tensor larger than `part_bytes`, cut into parts of that size.
bool Splittable(const Response& r, size_t part_bytes) {
  return !r.is_error() && r.collective == SO_ALLREDUCE && r.reduce_op != ReduceOp::kAdasum &&
         r.tensors.size() == 1 && !r.tensors[0].is_part() &&
         FusedBytes(r, r.tensors[0]) > part_bytes;
}

void AppendParts(Response whole, size_t part_bytes, std::vector<Response>* out) {
  const size_t esize = IsHalf(whole.dtype) ? sizeof(float) : DataTypeSize(whole.dtype);
  const int64_t total = static_cast<int64_t>(FusedBytes(whole, whole.tensors[0]) / esize);
  const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(part_bytes / esize));
  for (int64_t first = 0; first < total; first += step) {
    Response part = whole;
    ResponseTensor& t = part.tensors[0];
    t.part_first = first;
    t.part_count = std::min(step, total - first);
    if (first > 0) t.assigns_slot = false;  // the first part tells the workers the slot
    out->push_back(std::move(part));
  }
}

}  // namespace

std::vector<Response> TakeRound(std::vector<Response> ready, size_t round_bytes,
                                std::vector<Response>* later) {
  later->clear();
  bool prioritized = false;
  for (const Response& r : ready) prioritized = prioritized || r.priority != 0;
  if (!prioritized) return ready;
  std::stable_sort(ready.begin(), ready.end(),
                   [](const Response& a, const Response& b) { return a.priority > b.priority; });
  if (round_bytes == 0) return ready;
  std::vector<Response> queue;
  queue.reserve(ready.size());
  for (Response& r : ready) {
    if (Splittable(r, round_bytes)) {
      AppendParts(std::move(r), round_bytes, &queue);
    } else {
      queue.push_back(std::move(r));
    }
  }
  size_t bytes = 0;
  size_t take = 0;
  for (; take < queue.size(); ++take) {
    const Response& r = queue[take];
    size_t size = 0;
    if (!r.is_error()) {
      for (const ResponseTensor& t : r.tensors) size += FusedBytes(r, t);
    }
    if (take > 0 && bytes + size > round_bytes) break;
    bytes += size;
  }
  later->assign(std::make_move_iterator(queue.begin() + static_cast<std::ptrdiff_t>(take)),
                std::make_move_iterator(queue.end()));
  queue.resize(take);
  return queue;
}

}  // namespace scaleout
