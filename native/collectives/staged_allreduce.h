// Allreduce through PeerMemory (ranks that share a machine): each rank packs its elements into
// its own staging area, reduces one slice of them across every rank's area, and copies every
// slice's result out of the area of the rank that reduced it. See Note [Staged allreduce].
//
// Threading: coordinator thread only (it drives PeerMemory::Sync).
#ifndef SCALEOUT_COLLECTIVES_STAGED_ALLREDUCE_H_
#define SCALEOUT_COLLECTIVES_STAGED_ALLREDUCE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "collectives/machine_reduce.h"
#include "common/dtype.h"
#include "common/status.h"
#include "transport/peer_memory.h"

namespace scaleout {

// float16/bfloat16 are staged as they are and reduced in float32 by the rank that owns the
// slice, which applies `pre` to every input and `post` to the result, rounding once (Note
// [Halves on the wire]); pack and unpack then copy them unscaled. Unused for other dtypes.
struct HalfFactors {
  double pre = 1.0, post = 1.0;
};

// Note [Streaming stores] (staged_allreduce.cc): which stores a rank's staged allreduces of one
// size class write their areas with, chosen by timing them.
class StoreChooser {
 public:
  // Whether the next allreduce of this size class streams its stores.
  bool Next() const;
  // That allreduce moved `bytes` in `seconds`; the next one is the next run.
  void Record(bool streamed, size_t bytes, double seconds);

  // Every this many allreduces, one takes the kind of store that is not the faster.
  static constexpr uint64_t kProbeEvery = 32;
  // The first allreduces pay for first touches (one per parity of the area): not counted.
  static constexpr int kWarmRuns = 2;
  // A kind's estimate: the least time per byte of its last kKept allreduces.
  static constexpr int kKept = 4;

 private:
  double Estimate(bool streamed) const;

  double kept_[2][kKept] = {};  // seconds per byte; 0: not timed yet
  int next_[2] = {0, 0};        // where each kind's next time goes
  uint64_t runs_ = 0;
  int warm_left_ = kWarmRuns;
};

class StagedAllreduce {
 public:
  // `machines`, when not null, reduces this rank's slice with the same local rank on the other
  // machines (each machine with `memory`'s number of ranks): the result is then the reduction
  // over every machine (Note [Hierarchical allreduce]).
  // With `leader_based` (machines of different sizes), `machines` is given to each machine's
  // first rank only, and links those ranks.
  explicit StagedAllreduce(PeerMemory* memory, MachineReduce* machines = nullptr,
                           bool leader_based = false)
      : memory_(memory), machines_(machines), leader_based_(leader_based) {}

  // Writes this rank's elements [first, first + count) to dst.
  using PackFn = std::function<void(size_t first, size_t count, uint8_t* dst)>;
  // Takes the reduced elements [first, first + count) from src.
  using UnpackFn = std::function<void(size_t first, size_t count, const uint8_t* src)>;
  // Where this rank's elements [first, first + *run) already lie as pack would write them, or
  // nullptr (then pack them); *run, from 1 to count, is set either way: the owner of a slice
  // reduces straight from there (Note [Staged allreduce]).
  using InputFn = std::function<const uint8_t*(size_t first, size_t count, size_t* run)>;
  // Where unpack would write the reduced elements [first, first + count), times *post, or
  // nullptr: a small allreduce then reduces straight into them (Note [One-Sync allreduce]).
  using OutputFn = std::function<uint8_t*(size_t first, size_t count, double* post)>;

  // Reduces `total` elements of `dtype` with `op` (Average reduces as Sum). Every rank calls it
  // with the same total, dtype, op and factors.
  Status Run(size_t total, DataType dtype, ReduceOp op, const PackFn& pack, const UnpackFn& unpack,
             const HalfFactors& half = HalfFactors(), const InputFn& input = nullptr,
             const OutputFn& output = nullptr);

  // Note [Fast lane]: whether an allreduce of `total` elements of `dtype` is one the lane can
  // run (a one-Sync allreduce on one machine).
  bool LaneFits(size_t total, DataType dtype) const;
  // A one-Sync allreduce whose exchange is `agree` (Note [Fast lane]) instead of a Sync: this
  // rank's data is written into its area, then agree() says whether every rank's is there.
  // *agreed false: nothing was done (the area is not taken), and nothing is written to the output.
  Status RunAgreed(size_t total, DataType dtype, ReduceOp op, const PackFn& pack,
                   const UnpackFn& unpack, const OutputFn& output,
                   const std::function<bool()>& agree, bool* agreed);

  // The elements [*lo, *hi) of a count-element round that `rank` of `size` reduces: whole
  // 64-byte lines, as evenly spread as they go (exposed for tests).
  static void Slice(size_t count, size_t esize, int rank, int size, size_t* lo, size_t* hi);

 private:
  // Reduces n halves at `at` (this rank's area) with the same elements of the other ranks'
  // areas in float32, in rank order after this rank's own, and narrows the result into `at`.
  void ReduceHalves(uint8_t* at, size_t offset, size_t n, int parity, DataType dtype, ReduceOp op,
                    double pre, double post);

  // Note [One-Sync allreduce] (staged_allreduce.cc): a small allreduce on one machine.
  Status RunOneSync(size_t total, DataType dtype, ReduceOp op, const PackFn& pack,
                    const UnpackFn& unpack, const OutputFn& output);
  // Both: the data written into the area, exchanged by `agree` (or a Sync where null), reduced.
  Status OneExchange(size_t total, DataType dtype, ReduceOp op, const PackFn& pack,
                     const UnpackFn& unpack, const OutputFn& output,
                     const std::function<bool()>* agree, bool* exchanged);

  PeerMemory* memory_;
  MachineReduce* machines_;
  bool leader_based_;
  std::vector<float> acc_;               // ReduceHalves' float32 block
  std::vector<const uint8_t*> sources_;  // and the blocks it reduces
  std::vector<uint8_t> result_;          // RunOneSync's reduced block
  // Note [Streaming stores]: one per size class (powers of two from kStreamingBytes up, the
  // last holding everything larger), and for one-Sync allreduces one per power of two below.
  std::array<StoreChooser, 13> stores_;
  std::array<StoreChooser, 9> one_sync_stores_;
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_STAGED_ALLREDUCE_H_
