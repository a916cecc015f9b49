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
// rank gave. Rank 0 orders each round of ready work highest priority first (ties in the order
// they became ready), before fusing it. When the round holds more than one priority it sends at
// most SCALEOUT_PRIORITY_BYTES of it (always at least one response) and keeps the rest ready
// for the next round, where work of a higher priority that became ready meanwhile goes ahead of
// it: a coordinator executes what it was sent before it looks for more, so without the limit
// one large fused buffer of the last layers' gradients would keep the first layers' waiting
// behind it. Work of a single priority (everything, by default) goes out at once, as before.
// A tensor is never split: one larger than the limit is a round of its own.
//
// Pure: orders `ready` as above and returns the round to send now; the rest, in order, goes into
// `*later` (`round_bytes` 0: no limit).
std::vector<Response> TakeRound(std::vector<Response> ready, size_t round_bytes,
                                std::vector<Response>* later);

}  // namespace scaleout

#endif  // SCALEOUT_FUSION_FUSION_PLANNER_H_
