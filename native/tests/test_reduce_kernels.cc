// ReduceInto for every dtype and op (the batch half-precision reductions too).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "collectives/reduce_kernels.h"
#include "common/dtype.h"
#include "common/status.h"
#include "tests/bits.h"
#include "tests/dtype_buffers.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

using namespace dtype_buffers;

// Operands whose sums and products are exact in every dtype (no overflow in int8, at most 8
// significant bits for bfloat16), with negatives where the type has them.
void Operands(DataType dtype, size_t count, std::vector<double>* a, std::vector<double>* b) {
  const double base_a[] = {-7, -1, 0, 3, 5, 11, -11, 2, 9, -3, 1, -6, 8};
  const double base_b[] = {4, -1, -5, 3, -8, 0, -11, 7, -9, 6, 10, 2, -2};
  const size_t period = sizeof(base_a) / sizeof(base_a[0]);
  a->resize(count);
  b->resize(count);
  for (size_t i = 0; i < count; ++i) {
    double x = base_a[i % period];
    double y = base_b[(i + i / period) % period];  // vary the pairing between periods
    if (dtype == DataType::kUInt8 || dtype == DataType::kUInt16) {
      x = std::fabs(x);
      y = std::fabs(y);
    } else if (dtype == DataType::kBool) {
      x = (i & 1) != 0;
      y = (i & 2) != 0;
    } else if (IsFloatingPoint(dtype)) {
      x *= 0.5;
      y *= 0.25;
    }
    (*a)[i] = x;
    (*b)[i] = y;
  }
}

double Expected(DataType dtype, ReduceOp op, double x, double y) {
  if (dtype == DataType::kBool) {
    const bool either = x != 0 || y != 0;
    const bool both = x != 0 && y != 0;
    return (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? both : either;
  }
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
      return x + y;
    case ReduceOp::kMin:
      return std::fmin(x, y);
    case ReduceOp::kMax:
      return std::fmax(x, y);
    case ReduceOp::kProduct:
      return x * y;
  }
  return 0;
}

// A tail of the buffers past `count` that a correct kernel leaves alone: op(tail_a, tail_b)
// differs from tail_a for every op, so a kernel that runs past the end changes it.
void Tail(DataType dtype, ReduceOp op, double* tail_a, double* tail_b) {
  if (dtype == DataType::kBool) {
    const bool is_and = op == ReduceOp::kMin || op == ReduceOp::kProduct;
    *tail_a = is_and ? 1 : 0;
    *tail_b = is_and ? 0 : 1;
  } else {
    *tail_a = 3;
    *tail_b = op == ReduceOp::kMax ? 5 : 2;
  }
}

void CheckReduce(DataType dtype, ReduceOp op, size_t count) {
  const size_t kTail = 9;
  std::vector<double> a, b;
  Operands(dtype, count, &a, &b);
  double tail_a, tail_b;
  Tail(dtype, op, &tail_a, &tail_b);
  a.resize(count + kTail, tail_a);
  b.resize(count + kTail, tail_b);
  std::vector<uint8_t> inout = Encode(dtype, a);
  const std::vector<uint8_t> in = Encode(dtype, b);
  ReduceInto(inout.data(), in.data(), count, dtype, op);
  const std::vector<double> got = Decode(dtype, inout);
  int mismatches = 0;
  for (size_t i = 0; i < count + kTail; ++i) {
    const double want = i < count ? Expected(dtype, op, a[i], b[i]) : tail_a;
    if (got[i] != want && ++mismatches <= 3) {
      ADD_FAILURE(std::string(DataTypeName(dtype)) + " " + ReduceOpName(op) + " count " +
                  std::to_string(count) + " index " + std::to_string(i) + ": got " +
                  std::to_string(got[i]) + ", want " + std::to_string(want));
    }
  }
}

SO_TEST(ReduceIntoEveryTypeAndOp) {
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      for (size_t count = 0; count <= 67; ++count) CheckReduce(dtype, op, count);
      CheckReduce(dtype, op, 1000);
      CheckReduce(dtype, op, 4099);
    }
  }
}

SO_TEST(ReduceFromIsCopyThenReduceIntoInOnePass) {
  // The same bits as the two passes it replaces (Note [Staged allreduce]), NaNs included, and
  // nothing written past count.
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      for (size_t count : {size_t(0), size_t(1), size_t(31), size_t(67), size_t(4099)}) {
        std::vector<double> a, b;
        Operands(dtype, count, &a, &b);
        if (IsFloatingPoint(dtype) && count > 5) {
          a[1] = b[2] = std::nan("");
          // Where the order of the operands shows in the result: +0 against -0 (Min, Max)
          // and two NaNs of different signs (x86 keeps the first operand's).
          a[3] = 0.0, b[3] = -0.0;
          a[4] = std::nan(""), b[4] = -std::nan("");
        }
        const std::vector<uint8_t> ea = Encode(dtype, a), eb = Encode(dtype, b);
        std::vector<uint8_t> want = ea;
        ReduceInto(want.data(), eb.data(), count, dtype, op);
        std::vector<uint8_t> got(ea.size() + 16, 0xAB);
        ReduceFrom(got.data(), ea.data(), eb.data(), count, dtype, op);
        // Which of two NaNs a sum or product passes on is the compiler's choice of operand
        // order (IEEE 754 leaves it open): there, any NaN for a NaN. Min and Max select, so
        // their NaNs must match bit for bit.
        const bool arithmetic =
            op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kProduct;
        bool same = std::equal(want.begin(), want.end(), got.begin());
        if (!same && arithmetic && IsFloatingPoint(dtype)) {
          const std::vector<double> w = Decode(dtype, want), g = Decode(dtype, got);
          same = true;
          for (size_t i = 0; i < count; ++i) {
            same &= std::isnan(w[i]) ? std::isnan(g[i])
                                     : w[i] == g[i] && std::signbit(w[i]) == std::signbit(g[i]);
          }
        }
        const bool tail =
            std::all_of(got.end() - 16, got.end(), [](uint8_t v) { return v == 0xAB; });
        if (!same || !tail) {
          ADD_FAILURE(std::string(DataTypeName(dtype)) + " " + ReduceOpName(op) + " count " +
                      std::to_string(count) + (same ? ": wrote past count" : ": other bits"));
        }
      }
    }
  }
}

SO_TEST(ReduceIntoZeroCountTouchesNothing) {
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) ReduceInto(nullptr, nullptr, 0, dtype, op);
  }
  for (DataType dtype : kAllTypes) {
    if (dtype != DataType::kBool) ScaleBuffer(nullptr, 0, dtype, 0.5);
  }
}

SO_TEST(ReduceIntoIntegerExtremes) {
  // Min and Max over the full range, signed and unsigned.
  std::vector<int64_t> a = {std::numeric_limits<int64_t>::min(), -1, 0,
                            std::numeric_limits<int64_t>::max()};
  std::vector<int64_t> b = {0, std::numeric_limits<int64_t>::max(), -5,
                            std::numeric_limits<int64_t>::min()};
  std::vector<int64_t> lo = a, hi = a;
  ReduceInto(lo.data(), b.data(), a.size(), DataType::kInt64, ReduceOp::kMin);
  ReduceInto(hi.data(), b.data(), a.size(), DataType::kInt64, ReduceOp::kMax);
  EXPECT_TRUE(lo == (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -1, -5,
                                          std::numeric_limits<int64_t>::min()}));
  EXPECT_TRUE(hi == (std::vector<int64_t>{0, std::numeric_limits<int64_t>::max(), 0,
                                          std::numeric_limits<int64_t>::max()}));
  std::vector<uint8_t> u = {0, 255, 128, 7};
  const std::vector<uint8_t> v = {255, 0, 127, 7};
  ReduceInto(u.data(), v.data(), u.size(), DataType::kUInt8, ReduceOp::kMin);
  EXPECT_TRUE(u == (std::vector<uint8_t>{0, 0, 127, 7}));
  std::vector<int8_t> s = {-128, 127, -1, 0};
  const std::vector<int8_t> t = {127, -128, 1, -1};
  ReduceInto(s.data(), t.data(), s.size(), DataType::kInt8, ReduceOp::kMax);
  EXPECT_TRUE(s == (std::vector<int8_t>{127, 127, 1, 0}));
  std::vector<int32_t> p = {-46341, 46340, -3, 1 << 15};
  const std::vector<int32_t> q = {46340, -46341, -3, 1 << 15};
  ReduceInto(p.data(), q.data(), p.size(), DataType::kInt32, ReduceOp::kProduct);
  EXPECT_TRUE(p == (std::vector<int32_t>{-2147441940, -2147441940, 9, 1 << 30}));
}

SO_TEST(ReduceIntoBoolTruthTables) {
  const uint8_t a[] = {0, 0, 1, 1};
  const uint8_t b[] = {0, 1, 0, 1};
  const uint8_t want_or[] = {0, 1, 1, 1};
  const uint8_t want_and[] = {0, 0, 0, 1};
  for (ReduceOp op : kAllOps) {
    uint8_t out[4];
    std::memcpy(out, a, sizeof out);
    ReduceInto(out, b, 4, DataType::kBool, op);
    const bool is_and = op == ReduceOp::kMin || op == ReduceOp::kProduct;
    EXPECT_EQ(std::memcmp(out, is_and ? want_and : want_or, 4), 0);
  }
  // Any nonzero byte is true, and results are 0 or 1 again.
  uint8_t out[4] = {2, 255, 0, 16};
  const uint8_t in[4] = {0, 4, 0, 128};
  ReduceInto(out, in, 4, DataType::kBool, ReduceOp::kSum);
  EXPECT_TRUE(out[0] == 1 && out[1] == 1 && out[2] == 0 && out[3] == 1);
  uint8_t out2[4] = {2, 255, 0, 16};
  ReduceInto(out2, in, 4, DataType::kBool, ReduceOp::kProduct);
  EXPECT_TRUE(out2[0] == 0 && out2[1] == 1 && out2[2] == 0 && out2[3] == 1);
}

SO_TEST(ReduceIntoFloatMinMaxPropagateNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (DataType dtype :
       {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64}) {
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kSum, ReduceOp::kProduct}) {
      std::vector<uint8_t> out = Encode(dtype, {nan, 1, -inf, nan, inf});
      const std::vector<uint8_t> in = Encode(dtype, {1, nan, 2, nan, -inf});
      ReduceInto(out.data(), in.data(), 5, dtype, op);
      const std::vector<double> got = Decode(dtype, out);
      EXPECT_TRUE(std::isnan(got[0]));
      EXPECT_TRUE(std::isnan(got[1]));
      EXPECT_TRUE(std::isnan(got[3]));
      if (op == ReduceOp::kMin) EXPECT_EQ(got[2], -inf);
      if (op == ReduceOp::kMax) EXPECT_EQ(got[2], 2.0);
      if (op == ReduceOp::kSum) EXPECT_TRUE(std::isnan(got[4]));  // inf + -inf
      if (op == ReduceOp::kProduct) EXPECT_EQ(got[4], -inf);
    }
  }
}

// Reference for one element of a half-precision reduction: widen, op in float, round once.
uint16_t ReferenceHalfOp(DataType dtype, ReduceOp op, uint16_t x, uint16_t y) {
  const bool half = dtype == DataType::kFloat16;
  const float a = half ? HalfToFloat(x) : BFloat16ToFloat(x);
  const float b = half ? HalfToFloat(y) : BFloat16ToFloat(y);
  float r = 0;
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
      r = a + b;
      break;
    case ReduceOp::kProduct:
      r = a * b;
      break;
    case ReduceOp::kMin:
      r = std::isnan(a) || std::isnan(b) ? NAN : (b < a ? b : a);
      break;
    case ReduceOp::kMax:
      r = std::isnan(a) || std::isnan(b) ? NAN : (a < b ? b : a);
      break;
  }
  return half ? FloatToHalf(r) : FloatToBFloat16(r);
}

SO_TEST(ReduceIntoHalfMatchesScalarReferenceOnRandomBits) {
  std::mt19937 rng(12345);
  const size_t kCount = 1 << 15;
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    for (ReduceOp op : kAllOps) {
      std::vector<uint16_t> a(kCount), b(kCount);
      for (size_t i = 0; i < kCount; ++i) {
        a[i] = static_cast<uint16_t>(rng());
        // Half the time a neighbour of a, so that sums cancel and products stay in range.
        b[i] = (i & 1) ? static_cast<uint16_t>(rng())
                       : static_cast<uint16_t>((a[i] ^ 0x8000) + (rng() % 64) - 32);
      }
      // Whole (the hardware path for float16 on x86 with F16C) and in pieces of 7 elements
      // (too short for it: the portable path).
      std::vector<uint16_t> out = a;
      ReduceInto(out.data(), b.data(), kCount, dtype, op);
      std::vector<uint16_t> pieces = a;
      for (size_t start = 0; start < kCount; start += 7) {
        ReduceInto(pieces.data() + start, b.data() + start, std::min<size_t>(7, kCount - start),
                   dtype, op);
      }
      auto is_nan = [&](uint16_t v) {
        return std::isnan(dtype == DataType::kFloat16 ? HalfToFloat(v) : BFloat16ToFloat(v));
      };
      int bad = 0;
      for (size_t i = 0; i < kCount; ++i) {
        // Which NaN payload survives a + b may depend on the operand order the compiler chose.
        const bool same = pieces[i] == out[i] || (is_nan(pieces[i]) && is_nan(out[i]));
        if (!same && ++bad <= 3) EXPECT_EQ(pieces[i], out[i]);
        const uint16_t want = ReferenceHalfOp(dtype, op, a[i], b[i]);
        const bool ok = is_nan(want) ? is_nan(out[i]) : out[i] == want;
        if (!ok && ++bad <= 3) EXPECT_EQ(out[i], want);
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

SO_TEST(ReduceIntoHalfRoundsOnceToNearestEven) {
  // 2048 + 1 = 2049 lies halfway between the halves 2048 and 2050: ties to even, 2048.
  // 2048 + 3 = 2051, halfway between 2050 and 2052: 2052.
  std::vector<uint16_t> out = {FloatToHalf(2048), FloatToHalf(2048), FloatToHalf(2048)};
  const std::vector<uint16_t> in = {FloatToHalf(1), FloatToHalf(3), FloatToHalf(1.5f)};
  ReduceInto(out.data(), in.data(), 3, DataType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(HalfToFloat(out[0]), 2048.0f);
  EXPECT_EQ(HalfToFloat(out[1]), 2052.0f);
  EXPECT_EQ(HalfToFloat(out[2]), 2050.0f);  // 2049.5: above the midpoint
  // bfloat16 has 8 significant bits: 256 + 1 -> 256, 256 + 3 -> 260.
  std::vector<uint16_t> bout = {FloatToBFloat16(256), FloatToBFloat16(256)};
  const std::vector<uint16_t> bin = {FloatToBFloat16(1), FloatToBFloat16(3)};
  ReduceInto(bout.data(), bin.data(), 2, DataType::kBFloat16, ReduceOp::kSum);
  EXPECT_EQ(BFloat16ToFloat(bout[0]), 256.0f);
  EXPECT_EQ(BFloat16ToFloat(bout[1]), 260.0f);
}

// Summing 8 buffers (one large value, seven small ones): reducing the half buffers into each
// other rounds after every step, so the small values vanish (the float16 chain). Widening to
// float32, reducing there and narrowing once keeps them: the form the collectives use for
// half-precision sums over many ranks.
SO_TEST(HalfSumOfEightBuffersAccumulatedInFloat32RoundsOnce) {
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    const bool half = dtype == DataType::kFloat16;
    const float large = half ? 2048.0f : 256.0f;  // the ulp there is 2 in both
    auto narrow = [&](float f) { return half ? FloatToHalf(f) : FloatToBFloat16(f); };
    auto widen = [&](uint16_t h) { return half ? HalfToFloat(h) : BFloat16ToFloat(h); };
    const size_t kCount = 37;
    std::vector<std::vector<uint16_t>> ranks(8, std::vector<uint16_t>(kCount, narrow(1.0f)));
    ranks[0].assign(kCount, narrow(large));

    std::vector<uint16_t> chain = ranks[0];
    for (int r = 1; r < 8; ++r) {
      ReduceInto(chain.data(), ranks[r].data(), kCount, dtype, ReduceOp::kSum);
    }

    std::vector<float> total(kCount), widened(kCount);
    WidenToFloat(total.data(), ranks[0].data(), kCount, dtype, 1.0);
    for (int r = 1; r < 8; ++r) {
      WidenToFloat(widened.data(), ranks[r].data(), kCount, dtype, 1.0);
      ReduceInto(total.data(), widened.data(), kCount, DataType::kFloat32, ReduceOp::kSum);
    }
    std::vector<uint16_t> once(kCount);
    NarrowFromFloat(once.data(), total.data(), kCount, dtype, 1.0);

    for (size_t i = 0; i < kCount; ++i) {
      EXPECT_EQ(widen(chain[i]), large);        // each +1 is a tie, rounded back to even
      EXPECT_EQ(widen(once[i]), large + 8.0f);  // large + 7 is a tie, rounded to even
    }
  }
}

// Note [Streaming stores]: inside a StreamingStores scope, the same bits (aligned and not,
// with tails shorter than a vector), and the scope ends where it was opened.
SO_TEST(StreamingStoresGiveTheSameBits) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-100.0f, 100.0f);
  for (size_t count : {size_t{1}, size_t{15}, size_t{1024}, size_t{1037}, size_t{70001}}) {
    for (size_t shift : {size_t{0}, size_t{1}}) {  // 16-byte-aligned destinations, and not
      std::vector<float> a(count + 4), b(count + 4), want(count + 4), got(count + 4);
      for (size_t i = 0; i < a.size(); ++i) a[i] = value(rng), b[i] = value(rng);
      float* w = want.data() + shift;
      float* g = got.data() + shift;
      ReduceFrom(w, a.data(), b.data(), count, DataType::kFloat32, ReduceOp::kSum);
      {
        const StreamingStores on(true);
        ReduceFrom(g, a.data(), b.data(), count, DataType::kFloat32, ReduceOp::kSum);
      }
      EXPECT_EQ(std::memcmp(w, g, count * sizeof(float)), 0);
      {
        const StreamingStores on(true);
        CopyBytes(g, b.data(), count * sizeof(float));
      }
      EXPECT_EQ(std::memcmp(g, b.data(), count * sizeof(float)), 0);
    }
  }
  {
    const StreamingStores on(true);
    {
      const StreamingStores off(false);  // nested: restored on leaving
    }
    std::vector<double> x(4096, 1.5), y(4096, 2.0), out(4096);
    ReduceFrom(out.data(), x.data(), y.data(), x.size(), DataType::kFloat64, ReduceOp::kSum);
    EXPECT_EQ(out[4095], 3.5);  // other dtypes take the ordinary loop
  }
}

SO_TEST(ReduceIntoRejectsInvalidArguments) {
  float a[2] = {1, 2}, b[2] = {3, 4};
  EXPECT_THROW(ReduceInto(a, b, 2, static_cast<DataType>(SO_DTYPE_COUNT), ReduceOp::kSum),
               InternalError);
  EXPECT_THROW(ReduceInto(a, b, 2, DataType::kFloat32, static_cast<ReduceOp>(17)), InternalError);
  EXPECT_THROW(ReduceInto(a, b, 2, DataType::kBool, static_cast<ReduceOp>(-1)), InternalError);
}

}  // namespace
}  // namespace scaleout
