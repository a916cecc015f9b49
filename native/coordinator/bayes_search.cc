#include "coordinator/bayes_search.h"

#include <algorithm>
#include <cmath>

#include "common/status.h"

namespace scaleout {
namespace {

constexpr double kLength = 0.15;   // the kernel's length, in units of the box
constexpr int kGrid = 33;          // grid points a side searched by Next()
constexpr double kExploit = 0.01;  // improvement (in standard deviations) not worth a try

}  // namespace

BayesSearch::BayesSearch(int dims, double noise) : dims_(dims), noise_(noise) {
  SO_CHECK(dims >= 1 && dims <= 2, "the search has 1 or 2 dimensions");
}

double BayesSearch::Kernel(const std::vector<double>& a, const std::vector<double>& b) const {
  double d2 = 0;
  for (int i = 0; i < dims_; ++i) d2 += (a[i] - b[i]) * (a[i] - b[i]);
  return std::exp(-d2 / (2 * kLength * kLength));
}

void BayesSearch::Add(const std::vector<double>& point, double score) {
  SO_CHECK(static_cast<int>(point.size()) == dims_, "a point of the search's dimensions");
  points_.push_back(point);
  scores_.push_back(score);
  Fit();
}

void BayesSearch::Fit() {
  const size_t n = points_.size();
  mean_ = 0;
  for (double s : scores_) mean_ += s;
  mean_ /= static_cast<double>(n);
  double var = 0;
  for (double s : scores_) var += (s - mean_) * (s - mean_);
  var /= static_cast<double>(n);
  scale_ = var > 0 ? std::sqrt(var) : 1;
  // K + noise I, with a little more on the diagonal so that a point tried twice keeps the
  // system well conditioned even with no noise assumed.
  chol_.assign(n * n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) {
      double sum = Kernel(points_[i], points_[j]) + (i == j ? noise_ + 1e-6 : 0);
      for (size_t k = 0; k < j; ++k) sum -= chol_[i * n + k] * chol_[j * n + k];
      chol_[i * n + j] = i == j ? std::sqrt(std::max(sum, 1e-12)) : sum / chol_[j * n + j];
    }
  }
  // alpha = L^-T L^-1 y, y standardised.
  alpha_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    double sum = (scores_[i] - mean_) / scale_;
    for (size_t k = 0; k < i; ++k) sum -= chol_[i * n + k] * alpha_[k];
    alpha_[i] = sum / chol_[i * n + i];
  }
  for (size_t i = n; i-- > 0;) {
    double sum = alpha_[i];
    for (size_t k = i + 1; k < n; ++k) sum -= chol_[k * n + i] * alpha_[k];
    alpha_[i] = sum / chol_[i * n + i];
  }
}

void BayesSearch::Predict(const std::vector<double>& point, double* mean, double* stddev) const {
  const size_t n = points_.size();
  std::vector<double> k(n), v(n);
  double mu = 0;
  for (size_t i = 0; i < n; ++i) {
    k[i] = Kernel(point, points_[i]);
    mu += k[i] * alpha_[i];
  }
  // v = L^-1 k; the variance is k(x, x) - v.v.
  double var = 1;
  for (size_t i = 0; i < n; ++i) {
    double sum = k[i];
    for (size_t j = 0; j < i; ++j) sum -= chol_[i * n + j] * v[j];
    v[i] = sum / chol_[i * n + i];
    var -= v[i] * v[i];
  }
  *mean = mean_ + scale_ * mu;
  *stddev = scale_ * std::sqrt(std::max(var, 0.0));
}

std::vector<double> BayesSearch::Best() const {
  std::vector<double> best;
  double best_mean = -INFINITY;
  for (const auto& p : points_) {
    double mean = 0, stddev = 0;
    Predict(p, &mean, &stddev);
    if (mean > best_mean) {
      best_mean = mean;
      best = p;
    }
  }
  return best;
}

std::vector<double> BayesSearch::Next() const {
  if (points_.empty()) return std::vector<double>(static_cast<size_t>(dims_), 0.5);
  double incumbent = -INFINITY;
  for (const auto& p : points_) {
    double mean = 0, stddev = 0;
    Predict(p, &mean, &stddev);
    incumbent = std::max(incumbent, mean);
  }
  std::vector<double> best, point(static_cast<size_t>(dims_));
  double best_gain = -1;
  const int cells = dims_ == 1 ? kGrid : kGrid * kGrid;
  for (int c = 0; c < cells; ++c) {
    point[0] = (c % kGrid) / double(kGrid - 1);
    if (dims_ == 2) point[1] = (c / kGrid) / double(kGrid - 1);
    double mean = 0, stddev = 0;
    Predict(point, &mean, &stddev);
    // Expected improvement, in units of the scores' spread.
    const double gain = (mean - incumbent) / scale_ - kExploit;
    const double sigma = stddev / scale_;
    double expected = std::max(gain, 0.0);
    if (sigma > 1e-12) {
      const double z = gain / sigma;
      const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
      const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
      expected = gain * cdf + sigma * pdf;
    }
    if (expected > best_gain) {
      best_gain = expected;
      best = point;
    }
  }
  return best;
}

}  // namespace scaleout
