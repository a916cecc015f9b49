// Note [Tensor fusion]
// Ready allreduces that share dtype, reduce op, scale factors and joined ranks are merged into
// one response and reduced as one buffer, up to the fusion threshold in bytes (half-precision
// tensors count 4 bytes an element, since they are reduced in float32). Allgathers are merged
// the same way, counting the bytes gathered from every rank. The plan is made on the coordinator
// rank only and sent to every rank, so every rank packs the same tensors in the same order.
// A fused response takes the place of its first member; other responses keep their order.
#ifndef SCALEOUT_FUSION_FUSION_PLANNER_H_
#define SCALEOUT_FUSION_FUSION_PLANNER_H_

#include <cstddef>
#include <vector>

#include "coordinator/message.h"

namespace scaleout {

// Bytes one tensor of the response occupies in the fusion buffer.
size_t FusedBytes(const Response& response, const ResponseTensor& tensor);

// Pure: merges single-tensor responses as Note [Tensor fusion] describes.
std::vector<Response> PlanFusion(std::vector<Response> ready, size_t threshold_bytes);

// Note [Priority]
// A request may carry a priority (so_request.priority, default 0; the torch DistributedOptimizer
// gives the first layers' gradients the highest, so that the next forward pass can start on
// them while the last layers' are still being reduced). A response's priority is the highest any
// rank gave. A coordinator executes what it was sent before it looks for more, so a round of
// ready work is not preempted: one large fused buffer, or one large tensor, of the last layers'
// gradients would keep the first layers' waiting behind it. So when the ready work carries
// priorities (any not 0), rank 0 orders it highest first (ties in the order they became ready)
// and sends it in rounds of at most SCALEOUT_PRIORITY_BYTES (always at least one response),
// keeping the rest ready for the next round, where work of a higher priority that became ready
// meanwhile goes ahead of it; an allreduce of one tensor larger than the limit is cut into parts
// of that size (ResponseTensor::part_first/part_count; not Adasum's, whose rule is not
// elementwise), each reduced like a tensor of its own, the tensor completing with its last part.
// Work without priorities (everything, by default) goes out at once and whole, as before.
//
// Pure: orders and cuts `ready` as above and returns the round to send now; the rest, in order,
// goes into `*later` (`round_bytes` 0: order only, no limit and no parts).
std::vector<Response> TakeRound(std::vector<Response> ready, size_t round_bytes,
                                std::vector<Response>* later);

}  // namespace scaleout

#endif  // SCALEOUT_FUSION_FUSION_PLANNER_H_
