#include "collectives/machine_reduce.h"

#include <algorithm>
#include <utility>

#include "collectives/reduce_kernels.h"
#include "common/traffic.h"

namespace scaleout {
namespace {
constexpr size_t kHalfBlock = size_t(16) << 10;  // elements widened at once
}  // namespace

MachineReduce::MachineReduce(std::vector<DataTransport*> cross, EndpointPool* endpoints)
    : cross_(std::move(cross)), endpoints_(endpoints), scratch_(cross_.size()) {}

Status MachineReduce::Run(uint8_t* slice, size_t count, DataType dtype, ReduceOp op,
                          double half_post) {
  if (cross_.size() == 1 || endpoints_ == nullptr || machines() == 1) {
    return RunOn(0, slice, count, dtype, op, half_post);
  }
  const size_t esize = DataTypeSize(dtype);
  return endpoints_->RunSplit(count, esize, [&](int i, size_t begin, size_t end) {
    return RunOn(i, slice + begin * esize, end - begin, dtype, op, half_post);
  });
}

Status MachineReduce::RunOn(int server, uint8_t* data, size_t count, DataType dtype,
                            ReduceOp op, double half_post) {
  DataTransport* cross = cross_[server];
  const int machines = cross->size();
  const size_t esize = DataTypeSize(dtype);
  Scratch& scratch = scratch_[server];
  if (IsHalf(dtype)) {
    // Note [Halves on the wire]: every machine's halves to every rank, added in machine order.
    std::vector<uint8_t>& all = scratch.gathered;
    all.resize(machines * count * esize);
    Status s = machines == 1 ? Status::OK()
                             : cross->Allgatherv(data, count * esize, all.data(),
                                                 std::vector<size_t>(machines, count * esize));
    if (!s.ok()) return s;
    if (machines == 1) std::copy(data, data + count * esize, all.data());
    const traffic::Timed reducing(traffic::kREDUCE_NS);
    for (size_t begin = 0; begin < count; begin += kHalfBlock) {
      const size_t n = std::min(kHalfBlock, count - begin);
      scratch.acc.resize(n);
      WidenToFloat(scratch.acc.data(), all.data() + begin * esize, n, dtype, 1.0);
      for (int m = 1; m < machines; ++m) {
        AccumulateHalves(scratch.acc.data(), all.data() + (m * count + begin) * esize, n, dtype,
                         op, 1.0);
      }
      NarrowFromFloat(data + begin * esize, scratch.acc.data(), n, dtype, half_post);
    }
    return Status::OK();
  }
  if (machines == 1) return Status::OK();
  if (machines == 2) return cross->Allreduce(data, data, count, dtype, op);
  std::vector<size_t> counts(machines), bytes(machines);
  for (int m = 0; m < machines; ++m) {
    counts[m] = count / machines + (static_cast<size_t>(m) < count % machines ? 1 : 0);
    bytes[m] = counts[m] * esize;
  }
  std::vector<uint8_t>& gathered = scratch.gathered;
  gathered.resize(bytes[cross->rank()]);
  Status s = cross->ReduceScatter(data, gathered.data(), counts, dtype, op);
  if (!s.ok()) return s;
  return cross->Allgatherv(gathered.data(), gathered.size(), data, bytes);
}

}  // namespace scaleout
