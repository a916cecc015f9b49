#include "collectives/machine_reduce.h"

#include <algorithm>
#include <utility>

namespace scaleout {
namespace {
// Below this many bytes per server a split costs more in thread hand-offs than it gains (as
// for flat MPI allreduces, CollectiveExecutor::ReduceSplit).
constexpr size_t kMinSplitBytesPerServer = size_t(256) << 10;
}  // namespace

MachineReduce::MachineReduce(std::vector<DataTransport*> cross, EndpointPool* endpoints)
    : cross_(std::move(cross)), endpoints_(endpoints), gathered_(cross_.size()) {}

Status MachineReduce::Run(uint8_t* slice, size_t count, DataType dtype, ReduceOp op) {
  if (machines() == 1) return Status::OK();
  const size_t esize = DataTypeSize(dtype);
  const size_t k = cross_.size();
  if (k == 1 || endpoints_ == nullptr || count * esize < k * kMinSplitBytesPerServer) {
    return RunOn(0, slice, count, dtype, op);
  }
  // Contiguous parts, whole 64-byte lines each; the last takes the remainder.
  const size_t per_line = 64 / esize > 0 ? 64 / esize : 1;
  const size_t part = (count / k + per_line - 1) / per_line * per_line;
  std::vector<Status> results(k);
  endpoints_->Run([&](int i) {
    const size_t begin = std::min(count, part * i);
    const size_t end = i + 1 == static_cast<int>(k) ? count : std::min(count, part * (i + 1));
    results[i] = RunOn(i, slice + begin * esize, end - begin, dtype, op);
  });
  for (const Status& s : results) {
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status MachineReduce::RunOn(int server, uint8_t* data, size_t count, DataType dtype,
                            ReduceOp op) {
  DataTransport* cross = cross_[server];
  const int machines = cross->size();
  if (machines == 2) return cross->Allreduce(data, data, count, dtype, op);
  const size_t esize = DataTypeSize(dtype);
  std::vector<size_t> counts(machines), bytes(machines);
  for (int m = 0; m < machines; ++m) {
    counts[m] = count / machines + (static_cast<size_t>(m) < count % machines ? 1 : 0);
    bytes[m] = counts[m] * esize;
  }
  std::vector<uint8_t>& gathered = gathered_[server];
  gathered.resize(bytes[cross->rank()]);
  Status s = cross->ReduceScatter(data, gathered.data(), counts, dtype, op);
  if (!s.ok()) return s;
  return cross->Allgatherv(gathered.data(), gathered.size(), data, bytes);
}

}  // namespace scaleout
