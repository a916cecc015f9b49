#include "collectives/staged_allreduce.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "collectives/reduce_kernels.h"
#include "common/logging.h"
#include "common/traffic.h"

namespace scaleout {

// Note [Staged allreduce]
// A round handles as many elements as one staging area holds. Rank k owns slice k of the round:
//   1. every rank packs the slices it does not own into its own area;                   Sync
//   2. rank k, a block at a time, packs its own slice into its area, reduces the block
//      with the same block of every other rank's area, and unpacks the result into its
//      outputs at once, while the block is still in its cache;                          Sync
//   3. every rank unpacks each other slice from the area of the rank that owns it.
// Each element is reduced by one rank only, so all ranks get the same bits whatever the op or
// dtype. No rank reads another's own slice before the second Sync, which is why that slice
// can be packed after the first. The rounds alternate between each rank's two areas: a rank
// can pack round n + 1 while the others still unpack round n from its other area, and it only
// comes back to that area after the first Sync of round n + 1, by which time every rank has
// finished round n. So two Syncs per round suffice.
// Like MPI's buffers, the tensors of one collective must not overlap one another: outputs are
// written (step 2) while other inputs may still be packed (step 1 of a later round), so in-place
// tensors that alias each other would read a mix of inputs and results.
// Per rank and byte, this is one pass over the input and one over the output (the packing and
// unpacking a private fusion buffer needs too) plus reading 1/size of the bytes from each other
// rank: less memory traffic than packing, having MPI copy the buffer between processes, and
// unpacking. Where the owner's input lies as packing would write it (no prescale, the rank did
// not join: FusedTensors::Input), step 2 skips the packing: the owner reduces its input with
// the first other rank's block straight into its area (ReduceFrom), a tensor's piece at a time,
// then the rest as before, the same operations in the same order (a piece at a time since
// 2026-11-27: 200 x 16 KiB async-then-synchronize at 2 ranks 0.98-1.02 -> 0.94-0.96 ms, three
// interleaved runs each). Measured at 2 ranks on this VM's
// Xeon (2026-11-26, in place, float32, medians of 300 in three runs each): 256 KiB 56.0-57.3 us
// before, 53.1-54.8 after; 1 MiB 184-199 before, 175-181 after; 16 MiB 2.72-3.08 ms
// before, 2.59-2.66 after.
//
// Note [Hierarchical allreduce]
// Across machines with the same number of ranks each, step 2 splits: rank k first reduces its
// whole slice over its machine's areas (a reduce-scatter inside the machine), then reduces that
// slice with the ranks of local rank k on the other machines over the cross transport, then
// unpacks it; step 3 is the allgather inside the machine. Every machine's link carries traffic
// at once, and each rank sends only its slice (1/local size of the data) across. The slices
// are the same on every machine (same size, same total), so the ranks of one cross transport
// always hold the same elements. Across two machines one Allreduce does it (a + b and b + a are
// the same bits); across more, a ReduceScatter then an Allgatherv, so that each element is
// reduced in one place only and every rank gets the same bits, as on one machine
// (collectives/machine_reduce.h; large slices are split across the endpoint servers, each
// with its own cross communicator).
// Where machines have different numbers of ranks, slices do not line up across machines, so
// the machines' first ranks do the crossing (leader-based): after step 2 (each rank's slice
// reduced over its machine, not unpacked), a Sync; the first rank copies every slice from its
// owner's area into its own, so that its area holds the machine's sum, reduces that with the
// other machines' first ranks, and after a third Sync every rank copies the result from the
// first rank's area. One copy of the data crosses per machine, through one rank.
//
// Note [Halves on the wire]
// float16 and bfloat16 are staged as 2-byte elements: packing copies them as they are, the
// rank that owns a slice widens every rank's block to float32 (times the prescale), reduces in
// float32 (its own block first, then the others in rank order) and rounds once to the half
// type (times the post factor); unpacking copies. That is the arithmetic of widening at
// packing and narrowing at unpacking, so each element is rounded exactly once, as before, while
// the areas, the copies and the reads move half the bytes. Across machines the rank's slice is
// rounded to the half type once more before it crosses (factor 1, so a machine's sum is
// rounded once), the machines' sums are exchanged as halves, and every rank adds them in
// float32 in machine order and rounds with the post factor (collectives/machine_reduce.h):
// two roundings in all, half the bytes on the link, and still the same bits on every rank.
// Without shared memory (flat MPI) halves travel as 16-bit words too: prescaled where they are
// packed, combined by MPI user ops that add two halves in float32 and round (each combine of
// MPI's algorithm rounds once; large ones go as a reduce-scatter then an allgather, so each
// element is reduced in one place), and postscaled after (transport/mpi/mpi_data_transport.cc).

// Note [One-Sync allreduce]
// A small allreduce is bound by the Syncs, not by memory traffic: each is a round trip of cache
// lines between cores. So below kOneSyncBytes (what each rank reads from the others), every rank
// packs its whole input into its area, Syncs once, and reduces every rank's area in rank order
// (area 0, then 1, ...) into a block of its own, which it unpacks: the same operations in the
// same order on every rank, so the same bits. One Sync suffices for the reason two do above: a
// rank writes this parity's area again two rounds later, after the next round's Sync, which no
// rank passes before it has finished reading this round. Where the result goes to one tensor's
// output (FusedTensors::Output), the areas are reduced straight into it (ReduceFrom of areas 0
// and 1, then the rest, then the postscale), skipping the block and its copy out: 4 KiB in place
// at 2 ranks 6.2 -> 5.8 us per call, 16 KiB 10.4 -> 9.6 (back to back, medians of three runs,
// 2026-11-27). Not for halves (they are widened and rounded by one rank, Note [Halves on the
// wire]) nor across machines.

namespace {
constexpr size_t kBlockBytes = size_t(64) << 10;
constexpr size_t kOneSyncBytes = size_t(16) << 10;
}  // namespace

void StagedAllreduce::ReduceHalves(uint8_t* at, size_t offset, size_t n, int parity, DataType dtype,
                                   ReduceOp op, double pre, double post) {
  sources_.assign(1, at);  // this rank's own block first, then the others in rank order
  for (int k = 0; k < memory_->size(); ++k) {
    if (k != memory_->rank()) sources_.push_back(memory_->Area(k, parity) + offset);
  }
  ReduceHalvesOnce(at, sources_, n, dtype, op, pre, post, &acc_);
}

void StagedAllreduce::Slice(size_t count, size_t esize, int rank, int size, size_t* lo,
                            size_t* hi) {
  const size_t per_line = esize >= 64 ? 1 : 64 / esize;
  const size_t lines = (count + per_line - 1) / per_line;
  const size_t base = lines / static_cast<size_t>(size);
  const size_t extra = lines % static_cast<size_t>(size);
  const size_t k = static_cast<size_t>(rank);
  const size_t first_line = k * base + std::min(k, extra);
  const size_t my_lines = base + (k < extra ? 1 : 0);
  *lo = std::min(count, first_line * per_line);
  *hi = std::min(count, (first_line + my_lines) * per_line);
}

// Note [Streaming stores]
// On this VM a 64 MiB allreduce at two ranks took 9-13 ms in most jobs and 33-50 ms in others,
// the state lasting minutes (benchmarks/cross_core.py, 2026-12-07): in the slow jobs 4 MiB
// that the other core had just written was read at half the rate or less (a median 17.5
// against 39.3 GB/s), private copies no slower. The host (an AMD EPYC, an L3 per core complex)
// runs the two vCPUs in one complex or in two. A staged round hands each block from core to
// core while its lines still sit in the writer's caches, which across complexes costs 4x.
// Non-temporal stores (the lines go to memory, not into the writer's caches) into the area, by
// pack and by the owner's ReduceFrom, took the slow jobs to 12-13 ms, and the fast ones from
// 7-9 to 15-18 ms. Smaller allreduces lose as much in that state (64 KiB 37 us against 13, 1 MiB
// 490 against 70), and streaming stores win it back there too (12-17 us, 70-140 us) while
// costing 2x at 1 MiB in the fast state. So each rank times every staged allreduce (the
// one-Sync ones move too little to matter) with either kind, per size class (a power of two:
// one allreduce of 64 KiB and one of 64 MiB say nothing about each other). A class's first
// kWarmRuns, which pay for first touches of the area's two halves, are not counted; then one of
// each kind, then the faster, and every kProbeEvery-th the other. A kind's estimate is the least
// time per byte of its last kKept runs: preemption and a late peer only ever add time, and a
// change of state shows within kKept runs of the kind in use or at the next probe of the other.
// A rank's choice is its own: the areas are published by the Sync that follows, after the
// kernels' sfence, so the result is the same bits either way. Unpacking into the caller's output
// keeps ordinary stores (the caller reads it next).
// One-Sync allreduces (and the fast lane's) choose the same way from 256 bytes, per power of
// two: a 4 KiB one at two ranks took 4.5 us in the slow state (the VM's two vCPUs in two core
// complexes: a cache-line round trip 0.35 us against 0.05), its pack into the area much of the
// difference (each line the other rank read last time must be taken back from its cache). In a
// C loop of the same exchange (2026-12-08) the pack took 2,860 cycles with ordinary stores and
// 840 with streaming ones in the slow state, the whole exchange 3.4 against 2.1 us; in the fast
// state the packs were alike (750, 850 cycles) but the other rank's reading and waiting tripled
// (0.9 against 2.0 us). So what counts is the whole exchange with every rank storing the same
// way: a chooser counts only exchanges made (Next does not count, Record does), which every
// rank makes alike, so the ranks probe together; each times the whole exchange.
constexpr size_t kStreamingBytes = size_t{16} << 10;
constexpr size_t kOneSyncStreamingBytes = 256;

// The size class of an allreduce of `bytes` (at least `smallest`): log2 of bytes over
// `smallest`, the last of `classes` holding everything larger.
size_t StoreClass(size_t bytes, size_t smallest, size_t classes) {
  size_t c = 0;
  for (size_t b = bytes / smallest; b > 1 && c + 1 < classes; b >>= 1) ++c;
  return c;
}

namespace {

// One allreduce's kind of stores, from `chooser` (null: ordinary ones, untimed), and its time
// from here on, recorded by Done.
class ChosenStores {
 public:
  explicit ChosenStores(StoreChooser* chooser)
      : chooser_(chooser),
        streamed_(chooser != nullptr && chooser->Next()),
        started_(chooser != nullptr ? std::chrono::steady_clock::now()
                                    : std::chrono::steady_clock::time_point()) {}
  bool streamed() const { return streamed_; }
  // The allreduce moved `bytes`.
  void Done(size_t bytes) const {
    if (chooser_ == nullptr) return;
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started_;
    chooser_->Record(streamed_, bytes, took.count());
  }

 private:
  StoreChooser* chooser_;
  bool streamed_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace

double StoreChooser::Estimate(bool streamed) const {
  double least = 0.0;
  for (double t : kept_[streamed]) {
    if (t > 0.0 && (least == 0.0 || t < least)) least = t;
  }
  return least;
}

bool StoreChooser::Next() const {
  const uint64_t n = runs_;
  const double ordinary = Estimate(false), streamed = Estimate(true);
  if (ordinary == 0.0) return false;
  if (streamed == 0.0) return true;
  const bool faster = streamed < ordinary;
  return n % kProbeEvery == kProbeEvery - 1 ? !faster : faster;
}

void StoreChooser::Record(bool streamed, size_t bytes, double seconds) {
  ++runs_;
  if (bytes == 0) return;
  if (warm_left_ > 0) {
    --warm_left_;
    return;
  }
  int& at = next_[streamed];
  kept_[streamed][at] = seconds / static_cast<double>(bytes);
  at = (at + 1) % kKept;
}

Status StagedAllreduce::Run(size_t total, DataType dtype, ReduceOp op, const PackFn& pack,
                            const UnpackFn& unpack, const HalfFactors& half, const InputFn& input,
                            const OutputFn& output) {
  const size_t esize = DataTypeSize(dtype);
  const bool halves = IsHalf(dtype);
  // With machines to cross, the post factor is applied after the crossing.
  const bool crossing = machines_ != nullptr || leader_based_;
  const size_t per_round = memory_->area_bytes() / esize;
  const int self = memory_->rank();
  const int size = memory_->size();
  const size_t block = std::max<size_t>(1, kBlockBytes / esize);
  if (!halves && !crossing && total <= per_round &&
      total * esize * static_cast<size_t>(size - 1) <= kOneSyncBytes) {
    return RunOneSync(total, dtype, op, pack, unpack, output);
  }
  const ChosenStores chosen(
      !halves && total * esize >= kStreamingBytes
          ? &stores_[StoreClass(total * esize, kStreamingBytes, stores_.size())]
          : nullptr);
  const bool streamed = chosen.streamed();
  for (size_t first = 0; first < total; first += per_round) {
    const size_t count = std::min(per_round, total - first);
    const int parity = memory_->NextParity();
    const bool timed = LogEnabled(LogLevel::kDebug);
    using Clock = std::chrono::steady_clock;
    const auto t0 = timed ? Clock::now() : Clock::time_point();
    uint8_t* mine = memory_->Area(self, parity);
    size_t lo, hi;
    Slice(count, esize, self, size, &lo, &hi);
    {
      const StreamingStores stores(streamed);
      pack(first, lo, mine);
      pack(first + hi, count - hi, mine + hi * esize);
    }
    traffic::Add(traffic::kSHM_BYTES, static_cast<int64_t>(count * esize));  // this round's
    const auto t1 = timed ? Clock::now() : t0;
    Status s = memory_->Sync();
    if (!s.ok()) return s;
    const auto t2 = timed ? Clock::now() : t0;
    for (size_t begin = lo; begin < hi; begin += block) {
      const size_t n = std::min(block, hi - begin);
      uint8_t* at = mine + begin * esize;
      const StreamingStores stores(streamed);
      if (halves || !input || size < 2) {
        pack(first + begin, n, at);
        const traffic::Timed reducing(traffic::kREDUCE_NS);
        if (halves) {
          ReduceHalves(at, begin * esize, n, parity, dtype, op, half.pre,
                       crossing ? 1.0 : half.post);
        } else {
          for (int k = 0; k < size; ++k) {
            if (k != self) ReduceInto(at, memory_->Area(k, parity) + begin * esize, n, dtype, op);
          }
        }
      } else {
        // The first other rank's block with this rank's input, a tensor's piece at a time
        // (packed where it cannot be read as it lies), then the rest of the ranks.
        const int other = self == 0 ? 1 : 0;
        const uint8_t* first_theirs = memory_->Area(other, parity) + begin * esize;
        const traffic::Timed reducing(traffic::kREDUCE_NS);
        for (size_t done = 0, run = 0; done < n; done += run) {
          const uint8_t* in = input(first + begin + done, n - done, &run);
          if (in != nullptr) {
            ReduceFrom(at + done * esize, in, first_theirs + done * esize, run, dtype, op);
          } else {
            pack(first + begin + done, run, at + done * esize);
            ReduceInto(at + done * esize, first_theirs + done * esize, run, dtype, op);
          }
        }
        for (int k = other + 1; k < size; ++k) {
          if (k != self) ReduceInto(at, memory_->Area(k, parity) + begin * esize, n, dtype, op);
        }
      }
      if (machines_ == nullptr && !leader_based_) {
        const StreamingStores cached(false);
        unpack(first + begin, n, at);
      }
    }
    if (machines_ != nullptr && !leader_based_) {
      s = machines_->Run(mine + lo * esize, hi - lo, dtype, op, half.post);
      if (!s.ok()) return s;
      if (hi > lo) unpack(first + lo, hi - lo, mine + lo * esize);
    }
    const auto t3 = timed ? Clock::now() : t0;
    s = memory_->Sync();
    if (!s.ok()) return s;
    if (leader_based_) {
      // The machine's sum is spread over the areas; its first rank collects it into its own
      // area, reduces it with the other machines' first ranks, and every rank copies it out.
      if (self == 0) {
        for (int k = 1; k < size; ++k) {
          Slice(count, esize, k, size, &lo, &hi);
          if (hi > lo)
            std::memcpy(mine + lo * esize, memory_->Area(k, parity) + lo * esize,
                        (hi - lo) * esize);
          traffic::Add(traffic::kSHM_BYTES, static_cast<int64_t>((hi - lo) * esize));
        }
        SO_CHECK(machines_ != nullptr, "a leader-based allreduce without machines to cross");
        s = machines_->Run(mine, count, dtype, op, half.post);
        if (!s.ok()) return s;
      }
      s = memory_->Sync();
      if (!s.ok()) return s;
      unpack(first, count, memory_->Area(0, parity));
      continue;
    }
    const auto t4 = timed ? Clock::now() : t0;
    for (int k = 0; k < size; ++k) {
      if (k == self) continue;
      Slice(count, esize, k, size, &lo, &hi);
      if (hi > lo) unpack(first + lo, hi - lo, memory_->Area(k, parity) + lo * esize);
    }
    if (timed) {
      const auto t5 = Clock::now();
      auto us = [](Clock::duration d) {
        return std::chrono::duration<double, std::micro>(d).count();
      };
      SO_LOG(kDebug, "staged allreduce round of "
                         << count * esize << " bytes: pack " << us(t1 - t0) << " us, wait "
                         << us(t2 - t1) << " us, reduce own slice " << us(t3 - t2) << " us, wait "
                         << us(t4 - t3) << " us, unpack " << us(t5 - t4) << " us");
    }
  }
  chosen.Done(total * esize);
  return Status::OK();
}

// A small allreduce in one Sync: Note [One-Sync allreduce].
Status StagedAllreduce::RunOneSync(size_t total, DataType dtype, ReduceOp op, const PackFn& pack,
                                   const UnpackFn& unpack, const OutputFn& output) {
  bool exchanged = false;
  return OneExchange(total, dtype, op, pack, unpack, output, nullptr, &exchanged);
}

bool StagedAllreduce::LaneFits(size_t total, DataType dtype) const {
  return machines_ == nullptr && !leader_based_ && !IsHalf(dtype) && total > 0 &&
         total * DataTypeSize(dtype) <= memory_->area_bytes() &&
         total * DataTypeSize(dtype) * static_cast<size_t>(memory_->size() - 1) <= kOneSyncBytes;
}

Status StagedAllreduce::RunAgreed(size_t total, DataType dtype, ReduceOp op, const PackFn& pack,
                                  const UnpackFn& unpack, const OutputFn& output,
                                  const std::function<bool()>& agree, bool* agreed) {
  return OneExchange(total, dtype, op, pack, unpack, output, &agree, agreed);
}

Status StagedAllreduce::OneExchange(size_t total, DataType dtype, ReduceOp op, const PackFn& pack,
                                    const UnpackFn& unpack, const OutputFn& output,
                                    const std::function<bool()>* agree, bool* exchanged) {
  const size_t bytes = total * DataTypeSize(dtype);
  const int parity = memory_->PeekParity();
  // Note [Streaming stores]: chosen by timing, from kOneSyncStreamingBytes. The exchange's time
  // is recorded once it has been made (a called-off lane round is not one, and does not count:
  // every rank's chooser counts the same exchanges, so they probe together).
  const ChosenStores chosen(
      bytes >= kOneSyncStreamingBytes
          ? &one_sync_stores_[StoreClass(bytes, kOneSyncStreamingBytes, one_sync_stores_.size())]
          : nullptr);
  {
    const StreamingStores scope(chosen.streamed());
    pack(0, total, memory_->Area(memory_->rank(), parity));
  }
  if (agree != nullptr) {
    // Note [Fast lane]: the round is this rank's only if every rank agreed to it.
    *exchanged = (*agree)();
    if (!*exchanged) return Status::OK();
  } else {
    Status s = memory_->Sync();
    if (!s.ok()) return s;
    *exchanged = true;
  }
  memory_->NextParity();
  traffic::Add(traffic::kSHM_BYTES, static_cast<int64_t>(bytes));
  double post = 1.0;
  uint8_t* out = output && memory_->size() > 1 ? output(0, total, &post) : nullptr;
  if (out != nullptr) {
    {
      const traffic::Timed reducing(traffic::kREDUCE_NS);
      ReduceFrom(out, memory_->Area(0, parity), memory_->Area(1, parity), total, dtype, op);
      for (int k = 2; k < memory_->size(); ++k)
        ReduceInto(out, memory_->Area(k, parity), total, dtype, op);
    }
    if (post != 1.0) ScaleBuffer(out, total, dtype, post);
    chosen.Done(bytes);
    return Status::OK();
  }
  result_.resize(bytes);
  CopyBytes(result_.data(), memory_->Area(0, parity), bytes);  // Note [Copies]
  {
    const traffic::Timed reducing(traffic::kREDUCE_NS);
    for (int k = 1; k < memory_->size(); ++k)
      ReduceInto(result_.data(), memory_->Area(k, parity), total, dtype, op);
  }
  unpack(0, total, result_.data());
  chosen.Done(bytes);
  return Status::OK();
}

}  // namespace scaleout
