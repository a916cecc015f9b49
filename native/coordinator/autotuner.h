// Note [Autotune]
// ~~~~~~~~~~~~~~~
// With HOROVOD_AUTOTUNE=1 (or SCALEOUT_AUTOTUNE=1), rank 0 of the job tunes the two settings
// that only rank 0 uses: the fusion threshold and the cycle time (how long ready work may be
// held back to fuse more; Note [Dispatch]). Both shape the response lists rank 0 plans and
// sends, so every rank executes what rank 0 decided and nothing has to be agreed: the decision
// is the same on every rank by construction, costs no message, and survives any change of the
// job (an elastic generation starts a new tuner with its new processes).
//
// As in Horovod, a step is recognised by a collective's name coming round again (the n-th
// execution of any name starts step n), a sample is HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE steps,
// and its score is the bytes the job's collectives moved in it per microsecond of wall time
// (with the work per step fixed, that is the step rate). The first
// HOROVOD_AUTOTUNE_WARMUP_SAMPLES samples are not scored (buffers and caches fill). Then each
// sample tries one setting: the configured one first (so the result is never a guess worse than
// the start), three spread over the range, then what Note [Bayesian search] proposes, up to
// HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES samples in all; then the best stays for the rest of
// the job and rank 0 logs it as the settings to keep. So tuning is over after (warm-up + max
// samples) x steps per sample steps: 190 with the defaults (Horovod scores each setting by the
// median of five samples and searches each combination of its switches in turn, over a
// thousand steps by default, which is why short runs tuned poorly under it: horovod#2206). A
// job whose collectives never come round under one name (unnamed ones, or the torch.distributed
// backend's, named per call) has no steps: tuning stops, saying so, after kNoStepAfter of them.
// Only the global process set's collectives are counted.
// A setting the user fixed (its variable set) is not tuned, as in Horovod; init says so.
//
// The range searched: fusion threshold 0 to 64 MiB, cycle time 0 to 20 ms, on a square-root
// scale (small values, where the differences are, get most of the room). The hierarchical
// switches, the endpoint servers and the shared-memory staging area shape threads, segments and
// communicators made at init, so they are not tuned while the job runs (docs/autotune.md).
//
// HOROVOD_AUTOTUNE_LOG names a CSV that rank 0 writes as Horovod does: a header, a row per
// scored sample, and last the best setting's row; rows are flushed as they are written.
#ifndef SCALEOUT_COORDINATOR_AUTOTUNER_H_
#define SCALEOUT_COORDINATOR_AUTOTUNER_H_

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/bayes_search.h"
#include "coordinator/message.h"

namespace scaleout {

struct AutotuneOptions {
  int warmup_samples = 3;
  int steps_per_sample = 10;
  int max_samples = 16;
  double noise = 0.8;
  // The configured settings: where tuning starts, and the value of one that is fixed.
  size_t fusion_threshold_bytes = size_t(64) << 20;
  double cycle_time_ms = 1.0;
  bool fusion_fixed = false;
  bool cycle_fixed = false;
  // The log's columns for what is not tuned.
  bool hierarchical_allreduce = false;
  bool hierarchical_allgather = false;
  bool cache_enabled = true;
};

// Collectives after which, with no name seen twice, tuning stops (it could never end).
constexpr int64_t kNoStepAfter = 100000;
// The largest values searched.
constexpr size_t kAutotuneMaxFusionBytes = size_t(64) << 20;
constexpr double kAutotuneMaxCycleMs = 20.0;

// Rank 0's tuner; pure logic over a clock it is given. Not thread-safe (the coordinator's).
class Autotuner {
 public:
  // `log`: where the CSV goes, or nullptr.
  Autotuner(const AutotuneOptions& options, std::ostream* log);

  // Counts a collective that was executed, starting at `begin` (monotonic seconds). Returns
  // true when the settings to use changed.
  bool Observe(const Response& response, double begin);

  size_t fusion_threshold_bytes() const { return fusion_; }
  double cycle_time_ms() const { return cycle_; }
  // Tuning is over (or there was nothing to tune): the settings stay as they are.
  bool done() const { return done_; }
  int samples_scored() const { return scored_; }
  // "SCALEOUT_FUSION_THRESHOLD=... SCALEOUT_CYCLE_TIME=...": the settings to keep.
  std::string Keep() const;

 private:
  // A point of the search's square (fusion, cycle), each in [0, 1], and the settings it means.
  void Apply(const std::vector<double>& unit);
  std::vector<double> Free(const std::vector<double>& unit) const;  // the searched coordinates
  std::vector<double> Full(const std::vector<double>& free) const;
  void CloseSample(double seconds);
  void WriteRow(double score);

  AutotuneOptions options_;
  std::ostream* log_;
  BayesSearch search_;
  std::vector<std::vector<double>> design_;  // the first points tried, before the search's
  size_t fusion_;
  double cycle_;
  std::vector<double> unit_;  // the point being tried
  bool done_ = false;
  int warmup_left_;
  int scored_ = 0;
  int64_t observed_ = 0;  // collectives seen

  // The sample under way.
  std::unordered_map<std::string, int64_t> seen_;  // name -> executions
  int64_t step_ = 0;                               // the highest count in seen_
  int64_t sample_first_step_ = 0;
  double sample_begin_ = -1;
  double sample_bytes_ = 0;
  // Scores of each point tried (a point may come round again), for the log's last row.
  std::vector<std::pair<std::vector<double>, double>> tried_;
};

}  // namespace scaleout

#endif  // SCALEOUT_COORDINATOR_AUTOTUNER_H_
