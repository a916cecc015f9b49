// The step of a hierarchical allreduce that crosses machines (Note [Hierarchical allreduce]):
// reduces a slice, in place, with the ranks of the same local rank on every other machine,
// each element in one place only (so every rank gets the same bits), split across the
// endpoint servers' cross transports when large (Note [Endpoint servers]).
//
// Threading: coordinator thread only (it drives the EndpointPool).
#ifndef SCALEOUT_COLLECTIVES_MACHINE_REDUCE_H_
#define SCALEOUT_COLLECTIVES_MACHINE_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/endpoint_pool.h"
#include "common/dtype.h"
#include "common/status.h"
#include "transport/data_transport.h"

namespace scaleout {

class MachineReduce {
 public:
  // cross[i]: endpoint server i's transport over this local rank on every machine (at least
  // one); `endpoints` runs the servers (may be null with one transport).
  MachineReduce(std::vector<DataTransport*> cross, EndpointPool* endpoints);

  int machines() const { return cross_[0]->size(); }
  // Every rank of the cross transports calls it with the same count, dtype and op.
  Status Run(uint8_t* slice, size_t count, DataType dtype, ReduceOp op);

 private:
  // One transport's share: Allreduce across two machines (a + b and b + a are the same bits);
  // across more, ReduceScatter then Allgatherv, each part reduced by one machine.
  Status RunOn(int server, uint8_t* data, size_t count, DataType dtype, ReduceOp op);

  std::vector<DataTransport*> cross_;
  EndpointPool* endpoints_;
  std::vector<std::vector<uint8_t>> gathered_;  // per server, RunOn's staging (3+ machines)
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_MACHINE_REDUCE_H_
