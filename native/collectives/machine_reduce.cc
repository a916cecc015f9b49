#include "collectives/machine_reduce.h"

#include <algorithm>
#include <utility>

#include "collectives/reduce_kernels.h"
#include "common/traffic.h"

namespace scaleout {
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

Status MachineReduce::RunOn(int server, uint8_t* data, size_t count, DataType dtype, ReduceOp op,
                            double half_post) {
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
    std::vector<const uint8_t*> sources;
    for (int m = 0; m < machines; ++m) sources.push_back(all.data() + m * count * esize);
    ReduceHalvesOnce(data, sources, count, dtype, op, 1.0, half_post, &scratch.acc);
    return Status::OK();
  }
  if (machines == 1) return Status::OK();
  if (machines == 2) return cross->Allreduce(data, data, count, dtype, op);
  const std::vector<size_t> counts = EvenSplit(count, machines);
  std::vector<size_t> bytes(machines);
  for (int m = 0; m < machines; ++m) bytes[m] = counts[m] * esize;
  std::vector<uint8_t>& gathered = scratch.gathered;
  gathered.resize(bytes[cross->rank()]);
  Status s = cross->ReduceScatter(data, gathered.data(), counts, dtype, op);
  if (!s.ok()) return s;
  return cross->Allgatherv(gathered.data(), gathered.size(), data, bytes);
}

}  // namespace scaleout
