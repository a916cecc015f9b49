// Adasum (Note [Adasum]) over in-process ranks (tests/shared_areas.h's CrossGroup as the
// communicator): the tree of pairwise combinations per tensor at 2, 4 and 8 ranks against a
// direct evaluation, the same bits on every rank, the known cases, and the refusals.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collectives/adasum.h"
#include "tests/shared_areas.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

using test::CrossGroup;

// Rank q's element i of tensor t.
double Value(int q, size_t i, size_t t) { return std::sin(0.7 * q + 0.13 * i + 1.9 * t) * (q + 1); }

std::vector<double> Pair(const std::vector<double>& a, const std::vector<double>& b) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  const double ca = na > 0 ? 1 - dot / (2 * na) : 1, cb = nb > 0 ? 1 - dot / (2 * nb) : 1;
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = ca * a[i] + cb * b[i];
  return out;
}

SO_TEST(AdasumCombinesATreeOverTheRanksPerTensor) {
  const std::vector<size_t> counts = {5, 1, 64, 17};
  size_t total = 0;
  for (size_t c : counts) total += c;
  for (int size : {1, 2, 4, 8}) {
    CrossGroup group(size);
    std::vector<std::vector<double>> results(size, std::vector<double>(total));
    std::vector<Status> status(size);
    std::vector<std::thread> threads;
    for (int q = 0; q < size; ++q) {
      threads.emplace_back([&, q] {
        CrossGroup::Member member(&group, q);
        Adasum adasum(&member);
        size_t first = 0;
        for (size_t t = 0; t < counts.size(); ++t) {
          for (size_t i = 0; i < counts[t]; ++i) results[q][first + i] = Value(q, i, t);
          first += counts[t];
        }
        status[q] =
            adasum.Run(reinterpret_cast<uint8_t*>(results[q].data()), counts, DataType::kFloat64);
      });
    }
    for (std::thread& t : threads) t.join();
    size_t first = 0;
    for (size_t t = 0; t < counts.size(); ++t) {
      std::vector<std::vector<double>> level;
      for (int q = 0; q < size; ++q) {
        std::vector<double> v(counts[t]);
        for (size_t i = 0; i < counts[t]; ++i) v[i] = Value(q, i, t);
        level.push_back(v);
      }
      while (level.size() > 1) {
        std::vector<std::vector<double>> next;
        for (size_t k = 0; k < level.size(); k += 2) next.push_back(Pair(level[k], level[k + 1]));
        level = next;
      }
      for (int q = 0; q < size; ++q) {
        ASSERT_TRUE(status[q].ok());
        for (size_t i = 0; i < counts[t]; ++i) {
          if (!EXPECT_NEAR(results[q][first + i], level[0][i], 1e-12)) {
            ADD_FAILURE(std::to_string(size) + " ranks, rank " + std::to_string(q) + ", tensor " +
                        std::to_string(t) + ", element " + std::to_string(i));
            break;
          }
        }
        EXPECT_TRUE(std::memcmp(results[q].data(), results[0].data(), total * 8) == 0);
      }
      first += counts[t];
    }
  }
}

SO_TEST(AdasumPairKnownCasesAndZeroVectors) {
  // Equal vectors: their average (themselves); orthogonal: their sum; a zero vector: the other.
  const std::vector<float> a = {1, 2, 3}, b = {0, 0, 0}, e1 = {1, 0, 0}, e2 = {0, 1, 0};
  std::vector<float> out(3);
  auto combine = [&](const std::vector<float>& x, const std::vector<float>& y) {
    Adasum::Combine(reinterpret_cast<const uint8_t*>(x.data()),
                    reinterpret_cast<const uint8_t*>(y.data()),
                    reinterpret_cast<uint8_t*>(out.data()), {3}, DataType::kFloat32);
    return out;
  };
  EXPECT_TRUE(combine(a, a) == a);
  EXPECT_TRUE(combine(e1, e2) == (std::vector<float>{1, 1, 0}));
  EXPECT_TRUE(combine(a, b) == a);
  EXPECT_TRUE(combine(b, a) == a);
  // Halves: computed in float32 and rounded once to the half type.
  std::vector<uint16_t> h(3), g(3), o(3);
  const std::vector<float> hv = {0.5f, -1.25f, 3.0f};
  NarrowFromFloat(h.data(), hv.data(), 3, DataType::kFloat16, 1.0);
  NarrowFromFloat(g.data(), hv.data(), 3, DataType::kFloat16, 1.0);
  Adasum::Combine(reinterpret_cast<const uint8_t*>(h.data()),
                  reinterpret_cast<const uint8_t*>(g.data()), reinterpret_cast<uint8_t*>(o.data()),
                  {3}, DataType::kFloat16);
  EXPECT_TRUE(o == h);
}

SO_TEST(AdasumRefusesOtherRankCountsAndIntegerTensors) {
  CrossGroup group(1);
  CrossGroup::Member member(&group, 0);
  Adasum adasum(&member);
  std::vector<int32_t> ints(4, 1);
  Status s = adasum.Run(reinterpret_cast<uint8_t*>(ints.data()), {4}, DataType::kInt32);
  EXPECT_EQ(s.code(), SO_ERR_INVALID_ARGUMENT);
  CrossGroup three(3);
  std::vector<Status> status(3);
  std::vector<std::thread> threads;
  for (int q = 0; q < 3; ++q) {
    threads.emplace_back([&, q] {
      CrossGroup::Member m(&three, q);
      Adasum a(&m);
      std::vector<float> v(4, 1.0f);
      status[q] = a.Run(reinterpret_cast<uint8_t*>(v.data()), {4}, DataType::kFloat32);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& st : status) {
    EXPECT_EQ(st.code(), SO_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(st.message().find("power-of-two") != std::string::npos);
  }
}

}  // namespace
}  // namespace scaleout
