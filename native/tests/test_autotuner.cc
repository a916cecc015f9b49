// Autotune (Note [Autotune], Note [Bayesian search]): the search finds the top of a known
// function; the tuner over a simulated job (a clock whose step time depends on the settings)
// keeps the start through the warm-up, changes settings only at sample boundaries, ends after
// (warm-up + samples) x steps per sample steps near the best setting, writes Horovod's CSV, and
// leaves a fixed setting alone. The autotune settings' parsing is in test_config.cc.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/autotuner.h"
#include "coordinator/bayes_search.h"
#include "coordinator/message.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

// A smooth score with its top at (0.3, 0.7).
double Hill(const std::vector<double>& p) {
  const double y = p.size() > 1 ? p[1] : 0.7;
  return 100 - 50 * ((p[0] - 0.3) * (p[0] - 0.3) + (y - 0.7) * (y - 0.7));
}

SO_TEST(BayesSearchClimbsAKnownHill) {
  BayesSearch search(2, 0.0);
  for (const std::vector<double>& p :
       {std::vector<double>{1.0, 0.2}, {0.25, 0.5}, {0.5, 0.0}, {0.75, 0.75}}) {
    search.Add(p, Hill(p));
  }
  for (int i = 0; i < 12; ++i) {
    const std::vector<double> p = search.Next();
    ASSERT_EQ(p.size(), 2);
    search.Add(p, Hill(p));
  }
  const std::vector<double> best = search.Best();
  EXPECT_NEAR(best[0], 0.3, 0.1);
  EXPECT_NEAR(best[1], 0.7, 0.1);
  // Without noise the regression passes through what it was given.
  double mean = 0, stddev = 0;
  search.Predict({0.5, 0.0}, &mean, &stddev);
  EXPECT_NEAR(mean, Hill({0.5, 0.0}), 1e-3);
  EXPECT_NEAR(stddev, 0.0, 0.05);  // the diagonal's 1e-6 leaves a little
}

SO_TEST(BayesSearchWithNoiseSmoothsALuckyScore) {
  // One lucky score far from the others' hill must not be the choice when noise is assumed.
  BayesSearch noisy(1, 0.8);
  for (double x : {0.1, 0.15, 0.2, 0.25, 0.3, 0.35}) noisy.Add({x}, 100);
  noisy.Add({0.9}, 104);
  noisy.Add({0.95}, 80);
  EXPECT_TRUE(noisy.Best()[0] < 0.5);
  BayesSearch exact(1, 0.0);
  exact.Add({0.2}, 100);
  exact.Add({0.9}, 104);
  EXPECT_NEAR(exact.Best()[0], 0.9, 1e-9);
}

// One allreduce of `floats` float32 elements.
Response Allreduce(const std::string& name, int64_t floats) {
  Response r;
  ResponseTensor t;
  t.name = name;
  t.shape = {floats};
  r.tensors.push_back(t);
  return r;
}

// A job of three gradients a step whose step time (ms) is least at 8 MiB and 2 ms and grows
// away from there; drives the tuner for `steps` steps and returns the step times seen.
struct SimulatedJob {
  Autotuner* tuner;
  double now = 0;
  int step = 0;                 // steps run so far, over every Run()
  std::vector<int> changed_at;  // the steps (from 0) whose first collective changed the settings

  static double StepMs(size_t fusion, double cycle) {
    const double mib = static_cast<double>(fusion) / (1 << 20);
    return 10 + 0.05 * std::fabs(mib - 8) + 0.5 * std::fabs(cycle - 2);
  }

  void Run(int steps) {
    for (int s = 0; s < steps; ++s, ++step) {
      const double ms = StepMs(tuner->fusion_threshold_bytes(), tuner->cycle_time_ms());
      for (const char* name : {"layer2.grad", "layer1.grad", "layer0.grad"}) {
        if (tuner->Observe(Allreduce(name, 1000), now)) changed_at.push_back(step);
        now += ms / 3e3;
      }
    }
  }
};

SO_TEST(AutotunerWarmsUpSamplesAndSettlesNearTheBest) {
  AutotuneOptions o;  // Horovod's variables' defaults here: 3 warm-up, 10 steps, 16 samples
  std::ostringstream csv;
  Autotuner tuner(o, &csv);
  SimulatedJob job{&tuner};
  job.Run(40);
  // The warm-up (3 x 10 steps) keeps the configured settings.
  EXPECT_TRUE(job.changed_at.empty());
  EXPECT_EQ(tuner.fusion_threshold_bytes(), size_t(64) << 20);
  EXPECT_EQ(tuner.cycle_time_ms(), 1.0);
  job.Run(200);
  EXPECT_TRUE(tuner.done());
  EXPECT_EQ(tuner.samples_scored(), 16);
  // Changes happen only where a sample ends: at the first step of every 10th from step 40 on
  // (counting from 0: 3 warm-up samples of 10, then the configured setting's sample), the last
  // at step 190, where the kept setting takes over (unless it is the one tried last).
  for (int s : job.changed_at) {
    if (!EXPECT_EQ(s % 10, 0))
      ADD_FAILURE("a change inside a sample, at step " + std::to_string(s));
    EXPECT_TRUE(s >= 40);
  }
  ASSERT_TRUE(!job.changed_at.empty());
  EXPECT_TRUE(job.changed_at.back() == 190 || job.changed_at.back() == 180);
  // Near the best: the simulated step is within 5% of the best one (10 ms).
  const double tuned = SimulatedJob::StepMs(tuner.fusion_threshold_bytes(), tuner.cycle_time_ms());
  if (!EXPECT_TRUE(tuned < 10.5)) ADD_FAILURE("tuned to " + tuner.Keep() + "\n" + csv.str());
  // Horovod's CSV: its header, a row per scored sample, the chosen setting last.
  std::istringstream lines(csv.str());
  std::vector<std::string> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(line);
  ASSERT_EQ(rows.size(), 18);
  EXPECT_EQ(rows[0],
            "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,"
            "cycle_time_ms,tensor_fusion_threshold,score");
  EXPECT_EQ(rows[1].rfind("0,0,0,1,1,64,", 0), 0);  // the configured setting is tried first
  std::ostringstream last;
  last << "0,0,0,1," << tuner.cycle_time_ms() << ","
       << static_cast<double>(tuner.fusion_threshold_bytes()) / (1 << 20) << ",";
  EXPECT_EQ(rows.back().rfind(last.str(), 0), 0);
  EXPECT_NE(tuner.Keep().find("SCALEOUT_FUSION_THRESHOLD=" +
                              std::to_string(tuner.fusion_threshold_bytes())),
            std::string::npos);
  // Once done, nothing changes any more.
  const size_t settled = tuner.fusion_threshold_bytes();
  job.changed_at.clear();
  job.Run(100);
  EXPECT_TRUE(job.changed_at.empty());
  EXPECT_EQ(tuner.fusion_threshold_bytes(), settled);
}

SO_TEST(AutotunerLeavesAFixedSettingAlone) {
  AutotuneOptions o;
  o.warmup_samples = 0;
  o.steps_per_sample = 2;
  o.max_samples = 8;
  o.cycle_time_ms = 3.5;
  o.cycle_fixed = true;
  Autotuner tuner(o, nullptr);
  SimulatedJob job{&tuner};
  std::vector<size_t> fusions;
  for (int s = 0; s < 20; ++s) {
    job.Run(1);
    EXPECT_EQ(tuner.cycle_time_ms(), 3.5);
    fusions.push_back(tuner.fusion_threshold_bytes());
  }
  EXPECT_TRUE(tuner.done());
  bool varied = false;
  for (size_t f : fusions) varied = varied || f != fusions[0];
  EXPECT_TRUE(varied);  // the other one was tuned
  AutotuneOptions both = o;
  both.fusion_fixed = true;
  Autotuner idle(both, nullptr);
  EXPECT_TRUE(idle.done());  // nothing to tune
  SimulatedJob none{&idle};
  none.Run(30);
  EXPECT_TRUE(none.changed_at.empty());
}

SO_TEST(AutotunerStopsWhenNoNameComesRoundAgain) {
  AutotuneOptions o;
  Autotuner tuner(o, nullptr);
  double now = 0;
  for (int64_t i = 0; i < kNoStepAfter; ++i) {
    EXPECT_FALSE(tuner.Observe(Allreduce("call." + std::to_string(i), 10), now));
    now += 1e-4;
  }
  EXPECT_FALSE(tuner.done());
  tuner.Observe(Allreduce("one more", 10), now);
  EXPECT_TRUE(tuner.done());
  EXPECT_EQ(tuner.fusion_threshold_bytes(), size_t(64) << 20);
  EXPECT_EQ(tuner.cycle_time_ms(), 1.0);
}

SO_TEST(AutotunerCountsATensorInPartsOnceAStep) {
  AutotuneOptions o;
  o.warmup_samples = 0;
  o.steps_per_sample = 3;
  o.max_samples = 1;
  Autotuner tuner(o, nullptr);
  double now = 0;
  // Each step: one tensor in four parts. Three steps make a sample; the fourth step's first part
  // ends it (and tuning: one sample).
  for (int step = 0; step < 4 && !tuner.done(); ++step) {
    for (int part = 0; part < 4; ++part) {
      Response r = Allreduce("big", 4000);
      r.tensors[0].part_first = part * 1000;
      r.tensors[0].part_count = 1000;
      tuner.Observe(r, now);
      now += 0.001;
      if (step < 3) EXPECT_FALSE(tuner.done());
    }
  }
  EXPECT_TRUE(tuner.done());
  EXPECT_EQ(tuner.samples_scored(), 1);
}

}  // namespace
}  // namespace scaleout
