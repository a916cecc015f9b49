#include "collectives/collective_executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/logging.h"
#include "common/traffic.h"

#include "collectives/reduce_kernels.h"

namespace scaleout {
namespace {

// The reduction the transport performs (Average is a Sum followed by a division).
ReduceOp WireOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

// Factor applied after the reduction: postscale, and 1/size for Average (Horovod semantics:
// joined ranks still count in the divisor).
double PostFactor(const Response& r, int size) {
  return r.postscale * (r.reduce_op == ReduceOp::kAverage ? 1.0 / size : 1.0);
}

}  // namespace

CollectiveExecutor::CollectiveExecutor(const DataPlane& plane, EndpointPool* endpoints)
    : transports_(plane.transports), endpoints_(endpoints), adasum_(plane.transports[0]) {
  const AlgorithmPlan& plan = plane.plan;
  if (!plane.cross.empty()) machines_ = std::make_unique<MachineReduce>(plane.cross, endpoints);
  if (plan.allreduce() != SO_ALGORITHM_MPI) {
    staged_ = std::make_unique<StagedAllreduce>(
        plane.peers, machines_.get(), plan.allreduce() == SO_ALGORITHM_HIERARCHICAL_LEADER_BASED);
    if (plan.allreduce() == SO_ALGORITHM_SHARED_MEMORY && plane.peers->LaneRound() != nullptr &&
        plane.peers->size() > 1)
      lane_ = std::make_unique<FastLane>(plane.peers);
  }
  alltoall_ = plan.alltoall() == SO_ALGORITHM_SHARED_MEMORY
                  ? std::make_unique<StagedAlltoall>(plane.peers)
                  : std::make_unique<StagedAlltoall>(plane.peers, plane.transports[0],
                                                     plane.machine_of, plane.local_rank_of);
  if (plan.broadcast() != SO_ALGORITHM_MPI) {
    staged_broadcast_ =
        std::make_unique<StagedBroadcast>(plane.peers, plane.leaders, plane.transports[0]->rank(),
                                          plane.machine_of, plane.local_rank_of);
  }
  if (plan.allgather() == SO_ALGORITHM_SHARED_MEMORY) {
    staged_allgather_ = std::make_unique<StagedAllgather>(plane.peers);
  } else if (plan.allgather() == SO_ALGORITHM_HIERARCHICAL) {
    hierarchical_allgather_ = std::make_unique<HierarchicalAllgather>(
        plane.local, plane.leaders, plane.transports[0]->rank(), plane.machine_of,
        plane.local_rank_of);
  }
  if (plan.adasum() == SO_ALGORITHM_HIERARCHICAL) {
    machine_sum_ = std::make_unique<StagedAllreduce>(plane.peers);
    if (plane.leaders != nullptr) machine_adasum_ = std::make_unique<Adasum>(plane.leaders);
  }
}

Status CollectiveExecutor::ReduceSplit(const void* in, void* out, size_t count, DataType dtype,
                                       ReduceOp op) {
  const size_t esize = DataTypeSize(dtype);
  return endpoints_->RunSplit(count, esize, [&](int i, size_t begin, size_t end) {
    const char* src = static_cast<const char*>(in) + begin * esize;
    char* dst = static_cast<char*>(out) + begin * esize;
    return transports_[i]->Allreduce(in == out ? dst : src, dst, end - begin, dtype, op);
  });
}

Status CollectiveExecutor::Execute(const Response& r, const std::vector<TensorEntry*>& entries) {
  // Note [Traffic]: what this rank submitted; the layers below add what they move.
  traffic::SetKind(r.collective);
  // A tensor in parts (Note [Priority]) is one call, counted at its first part.
  const bool later_part = r.tensors.size() == 1 && r.tensors[0].part_first > 0;
  if (!later_part) traffic::Add(traffic::kCALLS, 1);
  int64_t submitted = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i] != nullptr)
      submitted += static_cast<int64_t>(ElementsMoved(r, entries, i) * DataTypeSize(r.dtype));
  }
  traffic::Add(traffic::kBYTES, submitted);
  const Status s = Run(r, entries);
  traffic::SetKind(-1);
  return s;
}

Status CollectiveExecutor::RunOnLane(const Response& r, TensorEntry* entry, const LanePost& post,
                                     bool* agreed) {
  *agreed = false;
  const std::vector<TensorEntry*> entries = {entry};
  if (lane_ == nullptr || r.reduce_op == ReduceOp::kAdasum ||
      !staged_->LaneFits(static_cast<size_t>(entry->request.NumElements()), r.dtype))
    return Status::OK();
  const double post_factor = PostFactor(r, transports_[0]->size());
  const FusedTensors fused(r, entries, post_factor, true);
  traffic::SetKind(r.collective);  // Note [Traffic]: counted as Execute counts, if it runs
  Status s = staged_->RunAgreed(
      fused.total(), r.dtype, WireOp(r.reduce_op),
      [&](size_t first, size_t count, uint8_t* dst) { fused.Pack(first, count, dst); },
      [&](size_t first, size_t count, const uint8_t* src) { fused.Unpack(first, count, src); },
      [&](size_t first, size_t count, double* post) { return fused.Output(first, count, post); },
      [&] {
        const traffic::Timed waiting(traffic::kWAIT_NS);
        return lane_->Agree(post);
      },
      agreed);
  if (*agreed) {
    traffic::Add(traffic::kCALLS, 1);
    traffic::Add(traffic::kLANE_CALLS, 1);
    traffic::Add(traffic::kBYTES, static_cast<int64_t>(fused.total() * DataTypeSize(r.dtype)));
  }
  traffic::SetKind(-1);
  return s;
}

Status CollectiveExecutor::Run(const Response& r, const std::vector<TensorEntry*>& entries) {
  switch (r.collective) {
    case SO_ALLREDUCE:
      return Allreduce(r, entries);
    case SO_ALLGATHER:
      return Allgather(r, entries);
    case SO_BROADCAST:
      return Broadcast(r, entries[0]);
    case SO_ALLTOALL:
      return Alltoall(r, entries[0]);
    case SO_REDUCESCATTER:
      return ReduceScatter(r, entries[0]);
    default:
      return Status::Internal("no executor for collective " + std::to_string(r.collective));
  }
}

Status CollectiveExecutor::Allreduce(const Response& r, const std::vector<TensorEntry*>& entries) {
  const double post = PostFactor(r, transports_[0]->size());
  if (r.reduce_op == ReduceOp::kAdasum) {  // Note [Adasum]: per tensor, over MPI
    const FusedTensors fused(r, entries, post, false);
    if (machine_sum_ != nullptr) return MachinesAdasum(r, fused);
    uint8_t* buf = fusion_.Get(fused.total() * DataTypeSize(r.dtype));
    fused.Pack(0, fused.total(), buf);
    Status s = adasum_.Run(buf, fused.Counts(), r.dtype);
    if (s.ok()) fused.Unpack(0, fused.total(), buf);
    return s;
  }
  const ReduceOp op = WireOp(r.reduce_op);
  const FusedTensors fused(r, entries, post, staged_ != nullptr);
  if (staged_ != nullptr) {
    return staged_->Run(
        fused.total(), r.dtype, op,
        [&](size_t first, size_t count, uint8_t* dst) { fused.Pack(first, count, dst); },
        [&](size_t first, size_t count, const uint8_t* src) { fused.Unpack(first, count, src); },
        HalfFactors{r.prescale, post},
        [&](size_t first, size_t count, size_t* run) { return fused.Input(first, count, run); },
        [&](size_t first, size_t count, double* post) { return fused.Output(first, count, post); });
  }
  // One tensor of this rank's own: reduce straight from input into output.
  if (entries.size() == 1 && entries[0] != nullptr && r.prescale == 1.0) {
    TensorEntry* e = entries[0];
    const size_t at = static_cast<size_t>(r.tensors[0].part_first) * DataTypeSize(r.dtype);
    const void* in = static_cast<const uint8_t*>(e->input) + at;
    void* out = static_cast<uint8_t*>(e->output) + at;
    Status s = ReduceSplit(in, out, fused.total(), r.dtype, op);
    if (s.ok() && post != 1.0) ScaleBuffer(out, fused.total(), r.dtype, post);
    return s;
  }
  const bool timed = LogEnabled(LogLevel::kDebug);
  using Clock = std::chrono::steady_clock;
  const auto t0 = timed ? Clock::now() : Clock::time_point();
  uint8_t* buf = fusion_.Get(fused.total() * DataTypeSize(r.dtype));
  fused.Pack(0, fused.total(), buf);
  const auto t1 = timed ? Clock::now() : t0;
  Status s = ReduceSplit(buf, buf, fused.total(), r.dtype, op);
  if (!s.ok()) return s;
  const auto t2 = timed ? Clock::now() : t0;
  fused.Unpack(0, fused.total(), buf);
  const auto t3 = timed ? Clock::now() : t0;
  SO_LOG(kDebug, "fused allreduce: pack "
                     << std::chrono::duration<double, std::micro>(t1 - t0).count() << " us, reduce "
                     << std::chrono::duration<double, std::micro>(t2 - t1).count() << " us, unpack "
                     << std::chrono::duration<double, std::micro>(t3 - t2).count() << " us");
  return Status::OK();
}

// Note [Hierarchical Adasum]
// With SCALEOUT_HIERARCHICAL_ALLREDUCE=1 (or HOROVOD_HIERARCHICAL_ALLREDUCE=1; not with the
// default auto, since Horovod's Adasum on CPU tensors is flat), where allreduces are
// hierarchical over a power of two of machines, op=Adasum is Horovod's hierarchical form (its
// GPU one): the ranks of a machine sum their vectors through shared memory (a staged allreduce
// inside the machine), each machine's first rank combines the machines' sums with the Adasum
// tree over the first ranks (Note [Adasum]; machines in the order of their first ranks), and
// the machine's ranks receive its result through a second staged sum to which only the first
// rank contributes (x + 0 is x: the same bits everywhere). Between machines each machine sends
// log2(machines) times the vector, once; a machine's ranks count as one worker whose gradient
// is their sum, so, as Horovod says for its hierarchical Adasum, the learning rate is scaled
// by the local size.
Status CollectiveExecutor::MachinesAdasum(const Response& r, const FusedTensors& fused) {
  const size_t esize = DataTypeSize(r.dtype);
  uint8_t* buf = fusion_.Get(fused.total() * esize);
  Status s = machine_sum_->Run(
      fused.total(), r.dtype, ReduceOp::kSum,
      [&](size_t first, size_t count, uint8_t* dst) { fused.Pack(first, count, dst); },
      [&](size_t first, size_t count, const uint8_t* src) {
        CopyBytes(buf + first * esize, src, count * esize);
      });
  if (!s.ok()) return s;
  const bool first_rank = machine_adasum_ != nullptr;
  if (first_rank) {
    s = machine_adasum_->Run(buf, fused.Counts(), r.dtype);
    if (!s.ok()) return s;
  }
  return machine_sum_->Run(
      fused.total(), r.dtype, ReduceOp::kSum,
      [&](size_t first, size_t count, uint8_t* dst) {
        if (first_rank) {
          CopyBytes(dst, buf + first * esize, count * esize);
        } else {
          std::memset(dst, 0, count * esize);
        }
      },
      [&](size_t first, size_t count, const uint8_t* src) { fused.Unpack(first, count, src); });
}

Status CollectiveExecutor::Allgather(const Response& r, const std::vector<TensorEntry*>& entries) {
  const int size = transports_[0]->size();
  const int self = transports_[0]->rank();
  const size_t esize = DataTypeSize(r.dtype);
  const size_t nt = r.tensors.size();
  std::vector<size_t> row_bytes(nt);
  std::vector<size_t> recv_bytes(size, 0);
  size_t send_bytes = 0;
  for (size_t t = 0; t < nt; ++t) {
    row_bytes[t] = Elements(ShapeOf(r, entries, t), 1) * esize;
    for (int k = 0; k < size; ++k)
      recv_bytes[k] += static_cast<size_t>(r.tensors[t].first_dims[k]) * row_bytes[t];
  }
  send_bytes = recv_bytes[self];
  size_t total = 0;
  for (size_t b : recv_bytes) total += b;
  auto prepare_result = [&](size_t t, TensorEntry* e) {
    size_t rows = 0;
    for (int k = 0; k < size; ++k) rows += static_cast<size_t>(r.tensors[t].first_dims[k]);
    e->result.resize(rows * row_bytes[t]);
    e->result_shape = e->request.shape;
    e->result_shape[0] = static_cast<int64_t>(rows);
  };
  if (nt == 1) {
    // Note [Join]: an allgather never runs while a rank has joined, so the entry is this rank's.
    TensorEntry* e = entries[0];
    prepare_result(0, e);
    return Allgatherv(e->input, send_bytes, e->result.data(), recv_bytes);
  }
  // Fused: pack this rank's tensors back to back; rank k's block holds its tensors in order.
  uint8_t* send = fusion_.Get(send_bytes, 0);
  size_t off = 0;
  for (size_t t = 0; t < nt; ++t) {
    const size_t bytes = static_cast<size_t>(r.tensors[t].first_dims[self]) * row_bytes[t];
    if (entries[t] != nullptr && bytes > 0) CopyBytes(send + off, entries[t]->input, bytes);
    off += bytes;
  }
  uint8_t* recv = fusion_.Get(total, 1);
  Status s = Allgatherv(send, send_bytes, recv, recv_bytes);
  if (!s.ok()) return s;
  std::vector<size_t> result_off(nt, 0);
  for (size_t t = 0; t < nt; ++t) {
    if (entries[t] != nullptr) prepare_result(t, entries[t]);
  }
  size_t block = 0;
  for (int k = 0; k < size; ++k) {
    size_t pos = block;
    for (size_t t = 0; t < nt; ++t) {
      const size_t bytes = static_cast<size_t>(r.tensors[t].first_dims[k]) * row_bytes[t];
      if (entries[t] != nullptr && bytes > 0) {
        CopyBytes(entries[t]->result.data() + result_off[t], recv + pos, bytes);
      }
      result_off[t] += bytes;
      pos += bytes;
    }
    block += recv_bytes[k];
  }
  return Status::OK();
}

Status CollectiveExecutor::Allgatherv(const void* in, size_t in_bytes, void* out,
                                      const std::vector<size_t>& recv_bytes) {
  if (hierarchical_allgather_ != nullptr) {
    return hierarchical_allgather_->Run(in, in_bytes, out, recv_bytes);
  }
  if (staged_allgather_ != nullptr) return staged_allgather_->Run(in, in_bytes, out, recv_bytes);
  return transports_[0]->Allgatherv(in, in_bytes, out, recv_bytes);
}

Status CollectiveExecutor::Broadcast(const Response& r, TensorEntry* e) {
  // Note [Join]: a broadcast never runs while a rank has joined, so the entry is this rank's.
  const size_t bytes = Elements(e->request.shape) * DataTypeSize(r.dtype);
  void* buf = e->output;
  if (transports_[0]->rank() == r.root && e->input != e->output && bytes > 0) {
    CopyBytes(e->output, e->input, bytes);
  }
  if (staged_broadcast_ != nullptr) return staged_broadcast_->Run(buf, bytes, r.root);
  return transports_[0]->Broadcast(buf, bytes, r.root);
}

Status CollectiveExecutor::Alltoall(const Response& r, TensorEntry* e) {
  const int size = transports_[0]->size();
  const std::vector<int64_t>& shape = e->request.shape;
  const size_t row_bytes = Elements(shape, 1) * DataTypeSize(r.dtype);
  std::vector<int64_t> splits = e->splits;
  if (splits.empty()) splits.assign(size, shape[0] / size);
  auto allocate = [&](const std::vector<int64_t>& received) {
    int64_t rows = 0;
    for (int64_t n : received) rows += n;
    e->result.resize(static_cast<size_t>(rows) * row_bytes);
    e->result_shape = shape;
    e->result_shape[0] = rows;
    return e->result.data();
  };
  return alltoall_->Run(static_cast<const uint8_t*>(e->input), splits, row_bytes, allocate,
                        &e->received_splits);
}

Status CollectiveExecutor::ReduceScatter(const Response& r, TensorEntry* e) {
  const int size = transports_[0]->size();
  const int self = transports_[0]->rank();
  const std::vector<int64_t>& shape = e->request.shape;
  const size_t row = Elements(shape, 1);
  const std::vector<size_t> rows = EvenSplit(static_cast<size_t>(shape[0]), size);
  std::vector<size_t> counts(size);
  for (int k = 0; k < size; ++k) counts[k] = rows[k] * row;
  const size_t total = Elements(shape);
  const size_t mine = counts[self];
  const double post = PostFactor(r, size);
  const ReduceOp op = WireOp(r.reduce_op);
  e->result_shape = shape;
  e->result_shape[0] = static_cast<int64_t>(rows[self]);
  e->result.resize(mine * DataTypeSize(r.dtype));
  const void* src = e->input;
  if (r.prescale != 1.0) {
    uint8_t* scaled = fusion_.Get(total * DataTypeSize(r.dtype), 0);
    CopyBytes(scaled, e->input, total * DataTypeSize(r.dtype));
    ScaleBuffer(scaled, total, r.dtype, r.prescale);
    src = scaled;
  }
  Status s = transports_[0]->ReduceScatter(src, e->result.data(), counts, r.dtype, op);
  if (s.ok() && post != 1.0) ScaleBuffer(e->result.data(), mine, r.dtype, post);
  return s;
}

}  // namespace scaleout
