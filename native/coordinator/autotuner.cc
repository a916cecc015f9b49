#include "coordinator/autotuner.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/logging.h"
#include "fusion/fusion_planner.h"

namespace scaleout {
namespace {

// The first points tried after the configured one (unit square, fusion then cycle): spread so
// that the search's first model sees both ends of both ranges.
const double kDesign[][2] = {{0.25, 0.5}, {0.5, 0.0}, {0.75, 0.75}};

double ToUnit(double value, double max) {
  return std::min(1.0, std::sqrt(std::max(value, 0.0) / max));
}

std::string Mib(size_t bytes) {
  std::ostringstream s;
  s << static_cast<double>(bytes) / (1 << 20);
  return s.str();
}

}  // namespace

Autotuner::Autotuner(const AutotuneOptions& options, std::ostream* log)
    : options_(options),
      log_(log),
      search_(std::max(1, int(!options.fusion_fixed) + int(!options.cycle_fixed)), options.noise),
      fusion_(options.fusion_threshold_bytes),
      cycle_(options.cycle_time_ms),
      warmup_left_(options.warmup_samples) {
  done_ = options.fusion_fixed && options.cycle_fixed;
  const std::vector<double> start = {
      ToUnit(static_cast<double>(fusion_), static_cast<double>(kAutotuneMaxFusionBytes)),
      ToUnit(cycle_, kAutotuneMaxCycleMs)};
  unit_ = start;
  // The design, in the searched coordinates, without repeats (a fixed setting makes some equal).
  std::vector<std::vector<double>> candidates = {start};
  for (const auto& p : kDesign) candidates.push_back({p[0], p[1]});
  for (const auto& c : candidates) {
    bool repeat = false;
    for (const auto& d : design_) repeat = repeat || Free(d) == Free(c);
    if (!repeat) design_.push_back(c);
  }
  if (log_ != nullptr) {
    *log_ << "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,"
             "cycle_time_ms,tensor_fusion_threshold,score"
          << std::endl;
  }
}

std::vector<double> Autotuner::Free(const std::vector<double>& unit) const {
  std::vector<double> free;
  if (!options_.fusion_fixed) free.push_back(unit[0]);
  if (!options_.cycle_fixed) free.push_back(unit[1]);
  return free;
}

std::vector<double> Autotuner::Full(const std::vector<double>& free) const {
  std::vector<double> unit = unit_;
  size_t i = 0;
  if (!options_.fusion_fixed) unit[0] = free[i++];
  if (!options_.cycle_fixed) unit[1] = free[i++];
  return unit;
}

void Autotuner::Apply(const std::vector<double>& unit) {
  unit_ = unit;
  if (!options_.fusion_fixed) {
    // Whole KiB: the log and the printed settings stay readable.
    const double bytes = unit[0] * unit[0] * static_cast<double>(kAutotuneMaxFusionBytes);
    fusion_ = static_cast<size_t>(std::llround(bytes / 1024)) * 1024;
  }
  if (!options_.cycle_fixed) {
    cycle_ = std::round(unit[1] * unit[1] * kAutotuneMaxCycleMs * 100) / 100;
  }
}

bool Autotuner::Observe(const Response& r, double begin) {
  if (done_) return false;
  if (++observed_ > kNoStepAfter && step_ <= 1) {
    // No name came round again: a job of unnamed (or per-call named) collectives has no steps
    // to count, and tuning could never end.
    done_ = true;
    seen_.clear();
    SO_LOG(kWarning, "autotune stopped: none of the first "
                         << kNoStepAfter
                         << " collectives came round again under the same name, so no training "
                            "step can be recognised (name them, as DistributedOptimizer does); "
                            "the settings stay as configured");
    return false;
  }
  int64_t bytes = 0;
  bool new_step = false;
  for (const ResponseTensor& t : r.tensors) {
    bytes += static_cast<int64_t>(FusedBytes(r, t));
    if (t.part_first > 0) continue;  // a tensor in parts counts once, at its first part
    const int64_t count = ++seen_[t.name];
    if (count > step_) {
      step_ = count;
      new_step = true;
    }
  }
  if (sample_begin_ < 0) {
    sample_begin_ = begin;
    sample_first_step_ = step_;
  }
  bool changed = false;
  if (new_step && step_ - sample_first_step_ >= options_.steps_per_sample) {
    const size_t fusion = fusion_;
    const double cycle = cycle_;
    CloseSample(begin - sample_begin_);
    changed = fusion != fusion_ || cycle != cycle_;
    sample_begin_ = begin;
    sample_first_step_ = step_;
    sample_bytes_ = 0;
  }
  sample_bytes_ += static_cast<double>(bytes);
  return changed;
}

void Autotuner::CloseSample(double seconds) {
  if (warmup_left_ > 0) {
    --warmup_left_;
    SO_LOG(kInfo, "autotune: warming up (" << warmup_left_ << " samples left)");
    return;
  }
  const double score = seconds > 0 ? sample_bytes_ / (seconds * 1e6) : 0;
  WriteRow(score);
  SO_LOG(kInfo, "autotune: sample " << scored_ + 1 << " of " << options_.max_samples
                                    << ": fusion threshold " << Mib(fusion_) << " MiB, cycle time "
                                    << cycle_ << " ms: " << score << " bytes/us");
  tried_.emplace_back(unit_, score);
  search_.Add(Free(unit_), score);
  ++scored_;
  if (scored_ >= options_.max_samples) {
    Apply(Full(search_.Best()));
    done_ = true;
    // The best point's own scores, averaged, for the log's last row (as Horovod's best row).
    double sum = 0;
    int n = 0;
    for (const auto& t : tried_) {
      if (Free(t.first) == Free(unit_)) {
        sum += t.second;
        ++n;
      }
    }
    WriteRow(n > 0 ? sum / n : 0);
    seen_.clear();
    std::ostringstream keep;
    // step_ has just begun: the samples took the steps before it.
    keep << "autotune: done after " << step_ - 1 << " steps; the settings to keep: " << Keep();
    LogNotice(keep.str());
    return;
  }
  const size_t next = static_cast<size_t>(scored_);
  Apply(next < design_.size() ? design_[next] : Full(search_.Next()));
}

void Autotuner::WriteRow(double score) {
  if (log_ == nullptr) return;
  // Horovod's columns: the switches it would tune (not tuned here: as configured), then the cycle
  // time in ms and the fusion threshold in MB.
  *log_ << int(options_.hierarchical_allreduce) << "," << int(options_.hierarchical_allgather)
        << ",0," << int(options_.cache_enabled) << "," << cycle_ << ","
        << static_cast<double>(fusion_) / (1 << 20) << "," << score << std::endl;
}

std::string Autotuner::Keep() const {
  std::ostringstream s;
  s << "SCALEOUT_FUSION_THRESHOLD=" << fusion_ << " SCALEOUT_CYCLE_TIME=" << cycle_;
  return s.str();
}

}  // namespace scaleout
