#include "collectives/machine_reduce.h"

#include <utility>

namespace scaleout {

MachineReduce::MachineReduce(std::vector<DataTransport*> cross, EndpointPool* endpoints)
    : cross_(std::move(cross)), endpoints_(endpoints), gathered_(cross_.size()) {}

Status MachineReduce::Run(uint8_t* slice, size_t count, DataType dtype, ReduceOp op) {
  if (machines() == 1) return Status::OK();
  if (cross_.size() == 1 || endpoints_ == nullptr) return RunOn(0, slice, count, dtype, op);
  const size_t esize = DataTypeSize(dtype);
  return endpoints_->RunSplit(count, esize, [&](int i, size_t begin, size_t end) {
    return RunOn(i, slice + begin * esize, end - begin, dtype, op);
  });
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
