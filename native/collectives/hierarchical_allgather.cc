#include "collectives/hierarchical_allgather.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace scaleout {

// Note [Hierarchical allgather]
// 1. Inside each machine, its ranks allgather their blocks (local rank order): the machine's
//    part, at its place in a staging buffer laid out machine by machine.
// 2. The machines' first ranks allgather the machines' parts: each part crosses the links once
//    to each other machine (flat MPI would send every rank's block across separately).
// 3. Each first rank broadcasts the other machines' parts inside its machine.
// 4. Every rank copies the blocks from the staging buffer into the result, in rank order
//    (ranks of one machine need not be consecutive).
// Sizes are known to every rank beforehand (recv_bytes), so no step exchanges them.

HierarchicalAllgather::HierarchicalAllgather(DataTransport* local, DataTransport* leaders, int rank,
                                             std::vector<int> machine_of,
                                             std::vector<int> local_rank_of)
    : local_(local),
      leaders_(leaders),
      rank_(rank),
      machine_of_(std::move(machine_of)),
      local_rank_of_(std::move(local_rank_of)) {
  for (int m : machine_of_) machines_ = std::max(machines_, m + 1);
  ranks_of_.resize(machines_);
  for (int q = 0; q < static_cast<int>(machine_of_.size()); ++q) {
    std::vector<int>& ranks = ranks_of_[machine_of_[q]];
    if (ranks.size() <= static_cast<size_t>(local_rank_of_[q])) ranks.resize(local_rank_of_[q] + 1);
    ranks[local_rank_of_[q]] = q;
  }
}

Status HierarchicalAllgather::Run(const void* in, size_t in_bytes, void* out,
                                  const std::vector<size_t>& recv_bytes) {
  const int mine = machine_of_[rank_];
  std::vector<size_t> machine_bytes(machines_, 0), machine_at(machines_ + 1, 0);
  for (int m = 0; m < machines_; ++m) {
    for (int q : ranks_of_[m]) machine_bytes[m] += recv_bytes[q];
    machine_at[m + 1] = machine_at[m] + machine_bytes[m];
  }
  const size_t total = machine_at[machines_];
  // 1. Inside the machine.
  std::vector<size_t> local_bytes;
  for (int q : ranks_of_[mine]) local_bytes.push_back(recv_bytes[q]);
  part_.resize(machine_bytes[mine]);
  Status s = local_->Allgatherv(in, in_bytes, part_.data(), local_bytes);
  if (!s.ok()) return s;
  staged_.resize(total);
  // 2. Across machines, first ranks only; the others place their machine's part themselves.
  if (leaders_ != nullptr) {
    s = leaders_->Allgatherv(part_.data(), part_.size(), staged_.data(), machine_bytes);
    if (!s.ok()) return s;
  } else if (!part_.empty()) {
    std::memcpy(staged_.data() + machine_at[mine], part_.data(), part_.size());
  }
  // 3. The other machines' parts, from the first rank (every rank knows the sizes).
  if (machines_ > 1) {
    if (machine_at[mine] > 0) {
      s = local_->Broadcast(staged_.data(), machine_at[mine], 0);
      if (!s.ok()) return s;
    }
    if (total > machine_at[mine + 1]) {
      s = local_->Broadcast(staged_.data() + machine_at[mine + 1], total - machine_at[mine + 1], 0);
      if (!s.ok()) return s;
    }
  }
  // 4. Rank order.
  uint8_t* dst = static_cast<uint8_t*>(out);
  for (size_t q = 0; q < recv_bytes.size(); ++q) {
    const int m = machine_of_[q];
    size_t at = machine_at[m];
    for (int k = 0; k < local_rank_of_[q]; ++k) at += recv_bytes[ranks_of_[m][k]];
    if (recv_bytes[q] > 0) std::memcpy(dst, staged_.data() + at, recv_bytes[q]);
    dst += recv_bytes[q];
  }
  return Status::OK();
}

}  // namespace scaleout
