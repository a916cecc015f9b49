// Note [Bayesian search]
// ~~~~~~~~~~~~~~~~~~~~~
// The autotuner's search (Note [Autotune]) over a box of d settings scaled to [0, 1]^d: a
// Gaussian process regression of the scores seen so far (squared-exponential kernel, length
// 0.15 of the box, scores standardised to mean 0 and variance 1, observation noise
// HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE added to the kernel's diagonal), and the next point is
// the one of a grid over the box (33 points a side) with the highest expected improvement over
// the best predicted score of a point already tried. A score here is one window of steps on a
// machine that is shared with everything else a job runs, so it is noisy: the final choice is
// not the best single score but the tried point whose predicted (smoothed) score is highest.
// Deterministic (no random restarts), so a run is repeatable from its log. Pure logic; d <= 2
// here, n <= a few dozen points, so the O(n^3) solve is nothing next to a training step.
#ifndef SCALEOUT_COORDINATOR_BAYES_SEARCH_H_
#define SCALEOUT_COORDINATOR_BAYES_SEARCH_H_

#include <cstddef>
#include <vector>

namespace scaleout {

class BayesSearch {
 public:
  // `dims`: the number of settings searched (1 or 2); `noise`: the observation noise, relative
  // to the scores' variance (0 makes the regression pass through every score).
  BayesSearch(int dims, double noise);

  void Add(const std::vector<double>& point, double score);
  size_t size() const { return points_.size(); }

  // The grid point with the highest expected improvement (the box's centre with no scores yet).
  std::vector<double> Next() const;
  // The tried point with the highest predicted score (empty with no scores yet).
  std::vector<double> Best() const;
  // The regression's mean and standard deviation at `point`, in the scores' units.
  void Predict(const std::vector<double>& point, double* mean, double* stddev) const;

 private:
  double Kernel(const std::vector<double>& a, const std::vector<double>& b) const;
  // Solves (K + noise I) alpha = standardised scores (Cholesky), after every Add.
  void Fit();

  int dims_;
  double noise_;
  std::vector<std::vector<double>> points_;
  std::vector<double> scores_;
  double mean_ = 0;
  double scale_ = 1;
  std::vector<double> chol_;   // lower factor of K + noise I, row-major n x n
  std::vector<double> alpha_;  // (K + noise I)^-1 y
};

}  // namespace scaleout

#endif  // SCALEOUT_COORDINATOR_BAYES_SEARCH_H_
