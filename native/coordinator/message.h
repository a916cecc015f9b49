// What ranks tell each other to agree on collectives: requests (worker -> rank 0) and
// responses (rank 0 -> every rank), and their encoding on the control channel.
#ifndef SCALEOUT_COORDINATOR_MESSAGE_H_
#define SCALEOUT_COORDINATOR_MESSAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace scaleout {

// The negotiated description of one named collective on one rank. Buffers are not part of it.
struct Request {
  std::string name;
  int32_t collective = SO_ALLREDUCE;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t priority = 0;  // Note [Priority]: not agreed on (rank 0 orders by the highest)

  // Every field the ranks must agree on is equal (allgather/alltoall: all but the first dim).
  bool SameParams(const Request& other) const;
  int64_t NumElements() const;
};

const char* CollectiveName(int32_t collective);
// "[2, 3]": a shape as errors and the timeline show it.
std::string ShapeString(const std::vector<int64_t>& shape);

// One tensor inside a (possibly fused) response.
struct ResponseTensor {
  std::string name;
  std::vector<int64_t> shape;       // the agreed shape (allgather: only shape[1:] is agreed;
                                    // shape[0] is the first submitting rank's first dim)
  std::vector<int64_t> first_dims;  // allgather: rows contributed by each rank
  int32_t cache_slot = -1;          // >= 0: the name's slot in the response cache
  bool assigns_slot = false;        // this response creates the cache slot
  // A part of an allreduce's tensor (Note [Priority]): its elements [part_first, part_first +
  // part_count) are reduced like a tensor of their own; the tensor completes with its last part.
  int64_t part_first = 0;
  int64_t part_count = -1;  // -1: the whole tensor
  bool is_part() const { return part_count >= 0; }
};

// What every rank executes, in the same order on every rank.
struct Response {
  int32_t collective = SO_ALLREDUCE;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<ResponseTensor> tensors;
  std::vector<int32_t> joined_ranks;  // ranks that contribute zeros (allreduce) or no rows
  int32_t error_code = 0;             // != 0: the named collectives fail with this status
  std::string error_message;
  std::vector<int32_t> culprit_ranks;  // the job's ranks to blame (Note [Error details])
  int32_t last_joined_rank = -1;       // SO_JOIN
  int32_t priority = 0;  // Note [Priority]: rank 0's alone, not sent (the order it sends is)

  bool is_error() const { return error_code != 0; }
  // The error as the named collectives fail with it, `where` appended to its message.
  Status error(const std::string& where = "") const {
    return Status(error_code, error_message + where).WithCulprits(culprit_ranks);
  }
};

// Control messages.
enum class MessageType : uint8_t {
  kRequests = 1,   // worker -> rank 0: new requests (full or by cache slot), join
  kResponses = 2,  // rank 0 -> worker: responses to execute in order
  kShutdown = 3,   // either way: this rank is shutting down (from rank 0: maybe with a reason)
  kAck = 4,        // reply to kShutdown
  kNotice = 5,     // rank 0 -> worker: a warning every rank logs (stalled collectives)
};

struct RequestMessage {
  std::vector<int32_t> cached_slots;  // requests whose parameters equal the cached ones
  std::vector<Request> full;          // requests sent in full
  bool join = false;
  int8_t blocked = -1;  // 1/0: the rank is (no longer) blocked; -1: unchanged
};

std::vector<uint8_t> EncodeRequests(const RequestMessage& m);
std::vector<uint8_t> EncodeResponses(const std::vector<Response>& responses);
std::vector<uint8_t> EncodeSignal(MessageType type);
// kShutdown from rank 0 that says why every rank must stop (Note [Stall shutdown]).
std::vector<uint8_t> EncodeShutdown(const std::string& reason);
// kNotice: text every worker logs as a warning of its own.
std::vector<uint8_t> EncodeNotice(const std::string& text);
std::string DecodeNotice(const std::vector<uint8_t>& bytes);
// The reason a kShutdown carries; empty for a plain one.
std::string DecodeShutdownReason(const std::vector<uint8_t>& bytes);
MessageType PeekType(const std::vector<uint8_t>& bytes);
RequestMessage DecodeRequests(const std::vector<uint8_t>& bytes);
// A compactly encoded tensor comes back with an empty name and its cache_slot set; the receiver
// restores the name from its ResponseCache.
std::vector<Response> DecodeResponses(const std::vector<uint8_t>& bytes);

}  // namespace scaleout

#endif  // SCALEOUT_COORDINATOR_MESSAGE_H_
