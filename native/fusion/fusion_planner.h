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

}  // namespace scaleout

#endif  // SCALEOUT_FUSION_FUSION_PLANNER_H_
