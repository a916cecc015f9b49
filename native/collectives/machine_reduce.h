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
  // Every rank of the cross transports calls it with the same count, dtype, op and factor.
  // float16/bfloat16 cross as they are; every rank adds the machines' halves in float32 and
  // rounds once with `half_post` (Note [Halves on the wire]). Other dtypes: half_post unused.
  Status Run(uint8_t* slice, size_t count, DataType dtype, ReduceOp op, double half_post = 1.0);

 private:
  // One transport's share: Allreduce across two machines (a + b and b + a are the same bits);
  // across more, ReduceScatter then Allgatherv, each part reduced by one machine. Halves:
  // Allgatherv, then each rank reduces in machine order.
  Status RunOn(int server, uint8_t* data, size_t count, DataType dtype, ReduceOp op,
               double half_post);

  struct Scratch {
    std::vector<uint8_t> gathered;  // 3+ machines: this one's part; halves: every machine's
    std::vector<float> acc;         // halves: a float32 block
  };
  std::vector<DataTransport*> cross_;
  EndpointPool* endpoints_;
  std::vector<Scratch> scratch_;  // per server
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_MACHINE_REDUCE_H_
