// ReduceInto, ScaleBuffer and the batch half-precision conversions, for every dtype and op.
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
#include "tests/test_framework.h"

namespace scaleout {
namespace {

const DataType kAllTypes[] = {DataType::kUInt8,   DataType::kInt8,     DataType::kInt16,
                              DataType::kInt32,   DataType::kInt64,    DataType::kFloat16,
                              DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                              DataType::kBool,    DataType::kUInt16};
const ReduceOp kAllOps[] = {ReduceOp::kAverage, ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kProduct};

template <typename T>
void Put(std::vector<uint8_t>& bytes, size_t i, T value) {
  std::memcpy(bytes.data() + i * sizeof(T), &value, sizeof(T));
}

template <typename T>
T Get(const std::vector<uint8_t>& bytes, size_t i) {
  T value;
  std::memcpy(&value, bytes.data() + i * sizeof(T), sizeof(T));
  return value;
}

// A buffer of `dtype` holding `values` (each must be representable).
std::vector<uint8_t> Encode(DataType dtype, const std::vector<double>& values) {
  std::vector<uint8_t> bytes(values.size() * DataTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    switch (dtype) {
      case DataType::kUInt8: Put(bytes, i, static_cast<uint8_t>(v)); break;
      case DataType::kInt8: Put(bytes, i, static_cast<int8_t>(v)); break;
      case DataType::kInt16: Put(bytes, i, static_cast<int16_t>(v)); break;
      case DataType::kUInt16: Put(bytes, i, static_cast<uint16_t>(v)); break;
      case DataType::kInt32: Put(bytes, i, static_cast<int32_t>(v)); break;
      case DataType::kInt64: Put(bytes, i, static_cast<int64_t>(v)); break;
      case DataType::kFloat16: Put(bytes, i, FloatToHalf(static_cast<float>(v))); break;
      case DataType::kBFloat16: Put(bytes, i, FloatToBFloat16(static_cast<float>(v))); break;
      case DataType::kFloat32: Put(bytes, i, static_cast<float>(v)); break;
      case DataType::kFloat64: Put(bytes, i, v); break;
      case DataType::kBool: Put(bytes, i, static_cast<uint8_t>(v != 0)); break;
    }
  }
  return bytes;
}

std::vector<double> Decode(DataType dtype, const std::vector<uint8_t>& bytes) {
  std::vector<double> values(bytes.size() / DataTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DataType::kUInt8: values[i] = Get<uint8_t>(bytes, i); break;
      case DataType::kInt8: values[i] = Get<int8_t>(bytes, i); break;
      case DataType::kInt16: values[i] = Get<int16_t>(bytes, i); break;
      case DataType::kUInt16: values[i] = Get<uint16_t>(bytes, i); break;
      case DataType::kInt32: values[i] = Get<int32_t>(bytes, i); break;
      case DataType::kInt64: values[i] = static_cast<double>(Get<int64_t>(bytes, i)); break;
      case DataType::kFloat16: values[i] = HalfToFloat(Get<uint16_t>(bytes, i)); break;
      case DataType::kBFloat16: values[i] = BFloat16ToFloat(Get<uint16_t>(bytes, i)); break;
      case DataType::kFloat32: values[i] = Get<float>(bytes, i); break;
      case DataType::kFloat64: values[i] = Get<double>(bytes, i); break;
      case DataType::kBool: values[i] = Get<uint8_t>(bytes, i); break;
    }
  }
  return values;
}

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
    case ReduceOp::kSum: return x + y;
    case ReduceOp::kMin: return std::fmin(x, y);
    case ReduceOp::kMax: return std::fmax(x, y);
    case ReduceOp::kProduct: return x * y;
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
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                         DataType::kFloat64}) {
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
    case ReduceOp::kSum: r = a + b; break;
    case ReduceOp::kProduct: r = a * b; break;
    case ReduceOp::kMin: r = std::isnan(a) || std::isnan(b) ? NAN : (b < a ? b : a); break;
    case ReduceOp::kMax: r = std::isnan(a) || std::isnan(b) ? NAN : (a < b ? b : a); break;
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

SO_TEST(ReduceIntoRejectsInvalidArguments) {
  float a[2] = {1, 2}, b[2] = {3, 4};
  EXPECT_THROW(ReduceInto(a, b, 2, static_cast<DataType>(SO_DTYPE_COUNT), ReduceOp::kSum),
               InternalError);
  EXPECT_THROW(ReduceInto(a, b, 2, DataType::kFloat32, static_cast<ReduceOp>(17)),
               InternalError);
  EXPECT_THROW(ReduceInto(a, b, 2, DataType::kBool, static_cast<ReduceOp>(-1)), InternalError);
}

// ---- ScaleBuffer ----

// What ScaleBuffer promises for integers: multiply in double, truncate toward zero, saturate.
double ExpectedIntegerScale(DataType dtype, double v, double factor) {
  double lo = 0, hi = 0;
  switch (dtype) {
    case DataType::kUInt8: lo = 0; hi = 255; break;
    case DataType::kInt8: lo = -128; hi = 127; break;
    case DataType::kInt16: lo = -32768; hi = 32767; break;
    case DataType::kUInt16: lo = 0; hi = 65535; break;
    case DataType::kInt32: lo = -2147483648.0; hi = 2147483647.0; break;
    default: lo = -0x1p63; hi = 0x1p63; break;  // int64: only small values are used
  }
  const double r = std::trunc(v * factor);
  return std::isnan(r) ? 0 : std::fmin(std::fmax(r, lo), hi);
}

SO_TEST(CopyBytesCopiesExactlyAtEveryAlignment) {
  std::vector<uint8_t> src(80000), dst(80000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  for (size_t bytes : {0, 1, 63, 64, 65, 4095, 4096, 4097, 70000}) {
    for (size_t src_off : {0, 1, 16, 33}) {
      for (size_t dst_off : {0, 3, 16, 48}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        CopyBytes(dst.data() + dst_off, src.data() + src_off, bytes);
        bool ok = true;
        for (size_t i = 0; i < dst.size() && ok; ++i) {
          const bool inside = i >= dst_off && i < dst_off + bytes;
          ok = dst[i] == (inside ? src[i - dst_off + src_off] : 0xEE);
        }
        if (!EXPECT_TRUE(ok)) {
          ADD_FAILURE(std::to_string(bytes) + " bytes, src +" + std::to_string(src_off) + ", dst +" + std::to_string(dst_off));
        }
      }
    }
  }
}

SO_TEST(ScaleBufferIntegers) {
  const double values[] = {-7, -3, -1, 0, 1, 3, 7, 100, -100, 127, -128, 200};
  const double factors[] = {0.5, -0.5, 2.0, 1.0 / 3, -1.5, 0.0, 1e6};
  for (DataType dtype : {DataType::kUInt8, DataType::kInt8, DataType::kInt16, DataType::kInt32,
                         DataType::kInt64, DataType::kUInt16}) {
    std::vector<double> in;
    for (double v : values) {
      if ((dtype == DataType::kUInt8 || dtype == DataType::kUInt16) && v < 0) continue;
      if (dtype == DataType::kInt8 && (v > 127 || v < -128)) continue;
      in.push_back(v);
    }
    for (double factor : factors) {
      std::vector<uint8_t> buf = Encode(dtype, in);
      ScaleBuffer(buf.data(), in.size(), dtype, factor);
      const std::vector<double> got = Decode(dtype, buf);
      for (size_t i = 0; i < in.size(); ++i) {
        EXPECT_EQ(got[i], ExpectedIntegerScale(dtype, in[i], factor));
      }
    }
  }
}

SO_TEST(ScaleBufferIntegerSpecifics) {
  std::vector<int32_t> i32 = {-7, 7, 123456789, -123456789};
  ScaleBuffer(i32.data(), i32.size(), DataType::kInt32, 0.5);
  // Truncation toward zero; 123456789 is not a float, so this needs double.
  EXPECT_TRUE(i32 == (std::vector<int32_t>{-3, 3, 61728394, -61728394}));

  std::vector<int8_t> i8 = {100, -100, 3};
  ScaleBuffer(i8.data(), i8.size(), DataType::kInt8, 2.0);
  EXPECT_TRUE(i8 == (std::vector<int8_t>{127, -128, 6}));  // saturates
  std::vector<uint8_t> u8 = {200, 5};
  ScaleBuffer(u8.data(), u8.size(), DataType::kUInt8, -1.0);
  EXPECT_TRUE(u8 == (std::vector<uint8_t>{0, 0}));

  const int64_t big = (int64_t{1} << 53) - 1;
  std::vector<int64_t> i64 = {big, -big, int64_t{1} << 62, int64_t{1} << 62, 1000000000000001};
  ScaleBuffer(i64.data(), 2, DataType::kInt64, 0.5);
  ScaleBuffer(i64.data() + 2, 1, DataType::kInt64, 4.0);
  ScaleBuffer(i64.data() + 3, 1, DataType::kInt64, -2.0);
  ScaleBuffer(i64.data() + 4, 1, DataType::kInt64, 1.0);
  EXPECT_EQ(i64[0], (big - 1) / 2);
  EXPECT_EQ(i64[1], -(big - 1) / 2);
  EXPECT_EQ(i64[2], std::numeric_limits<int64_t>::max());  // saturates
  EXPECT_EQ(i64[3], std::numeric_limits<int64_t>::min());  // exactly -2^63
  EXPECT_EQ(i64[4], 1000000000000001);                     // factor 1: untouched

  std::vector<int16_t> nan_scaled = {5, -5, 0};
  ScaleBuffer(nan_scaled.data(), 3, DataType::kInt16, std::nan(""));
  EXPECT_TRUE(nan_scaled == (std::vector<int16_t>{0, 0, 0}));
  std::vector<int16_t> inf_scaled = {5, -5, 0};
  ScaleBuffer(inf_scaled.data(), 3, DataType::kInt16, INFINITY);
  EXPECT_TRUE(inf_scaled == (std::vector<int16_t>{32767, -32768, 0}));  // 0 * inf is NaN
}

SO_TEST(ScaleBufferFloats) {
  std::vector<float> f32 = {1, -2, 0.5f, 3, 1e30f};
  ScaleBuffer(f32.data(), f32.size(), DataType::kFloat32, 0.25);
  EXPECT_TRUE(f32 == (std::vector<float>{0.25f, -0.5f, 0.125f, 0.75f, 0.25e30f}));
  std::vector<float> tenth = {3, 7};
  ScaleBuffer(tenth.data(), 2, DataType::kFloat32, 0.1);
  EXPECT_EQ(tenth[0], 3.0f * 0.1f);  // computed in float
  EXPECT_EQ(tenth[1], 7.0f * 0.1f);

  std::vector<double> f64 = {3, -7, 1e300};
  ScaleBuffer(f64.data(), f64.size(), DataType::kFloat64, 1.0 / 3);
  EXPECT_EQ(f64[0], 3 * (1.0 / 3));
  EXPECT_EQ(f64[1], -7 * (1.0 / 3));
  EXPECT_EQ(f64[2], 1e300 * (1.0 / 3));
  for (size_t count : {size_t{1}, size_t{17}, size_t{1001}}) {
    std::vector<double> v(count + 4, 8.0);
    ScaleBuffer(v.data(), count, DataType::kFloat64, 0.5);
    EXPECT_EQ(v[count - 1], 4.0);
    EXPECT_EQ(v[count], 8.0);  // past count: untouched
  }
}

SO_TEST(ScaleBufferHalfEveryBitPattern) {
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    const bool half = dtype == DataType::kFloat16;
    for (double factor : {0.5, 1.0 / 3, 3.0, -1.0}) {
      std::vector<uint16_t> buf(65536);
      for (uint32_t i = 0; i < 65536; ++i) buf[i] = static_cast<uint16_t>(i);
      ScaleBuffer(buf.data(), buf.size(), dtype, factor);
      int bad = 0;
      for (uint32_t i = 0; i < 65536; ++i) {
        const uint16_t h = static_cast<uint16_t>(i);
        const float wide = half ? HalfToFloat(h) : BFloat16ToFloat(h);
        const float scaled = wide * static_cast<float>(factor);
        const uint16_t want = half ? FloatToHalf(scaled) : FloatToBFloat16(scaled);
        const float got = half ? HalfToFloat(buf[i]) : BFloat16ToFloat(buf[i]);
        const bool ok = std::isnan(scaled) ? std::isnan(got) : buf[i] == want;
        if (!ok && ++bad <= 3) EXPECT_EQ(buf[i], want);
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

SO_TEST(ScaleBufferFactorOneIsANoOp) {
  // Multiplying by 1.0 would quieten a signalling NaN; a no-op leaves every bit alone.
  std::vector<uint32_t> f32 = {0x7f800001u, 0x80000000u, 0x00000001u};
  ScaleBuffer(f32.data(), f32.size(), DataType::kFloat32, 1.0);
  EXPECT_TRUE(f32 == (std::vector<uint32_t>{0x7f800001u, 0x80000000u, 0x00000001u}));
  std::vector<uint16_t> f16 = {0x7c01, 0x8000};
  ScaleBuffer(f16.data(), f16.size(), DataType::kFloat16, 1.0);
  EXPECT_TRUE(f16 == (std::vector<uint16_t>{0x7c01, 0x8000}));
  std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::max()};
  ScaleBuffer(i64.data(), 1, DataType::kInt64, 1.0);
  EXPECT_EQ(i64[0], std::numeric_limits<int64_t>::max());
}

SO_TEST(ScaleBufferRejectsBoolAndInvalidTypes) {
  uint8_t flags[2] = {1, 0};
  EXPECT_THROW(ScaleBuffer(flags, 2, DataType::kBool, 0.5), InternalError);
  EXPECT_THROW(ScaleBuffer(flags, 2, DataType::kBool, 1.0), InternalError);
  EXPECT_THROW(ScaleBuffer(flags, 2, static_cast<DataType>(42), 0.5), InternalError);
}

// ---- WidenToFloat / NarrowFromFloat ----

SO_TEST(WidenToFloatMatchesScalarOnEveryBitPattern) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> out(65536);
  WidenToFloat(out.data(), all.data(), all.size(), DataType::kFloat16, 1.0);
  int bad = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    if (Bits(out[i]) != Bits(HalfToFloat(all[i])) && ++bad <= 3) {
      EXPECT_EQ(Bits(out[i]), Bits(HalfToFloat(all[i])));
    }
  }
  WidenToFloat(out.data(), all.data(), all.size(), DataType::kBFloat16, 1.0);
  for (uint32_t i = 0; i < 65536; ++i) {
    if (Bits(out[i]) != i << 16 && ++bad <= 3) EXPECT_EQ(Bits(out[i]), i << 16);
  }
  // One element per call: the portable path.
  for (uint32_t i = 0; i < 65536; ++i) {
    float one = 0;
    WidenToFloat(&one, &all[i], 1, DataType::kFloat16, 1.0);
    if (Bits(one) != Bits(HalfToFloat(all[i])) && ++bad <= 3) {
      EXPECT_EQ(Bits(one), Bits(HalfToFloat(all[i])));
    }
  }
  EXPECT_EQ(bad, 0);
  // With a factor: the product in float.
  WidenToFloat(out.data(), all.data(), all.size(), DataType::kFloat16, 0.125);
  for (uint32_t i = 0; i < 0x7c00; i += 97) EXPECT_EQ(out[i], HalfToFloat(all[i]) * 0.125f);
}

SO_TEST(AccumulateHalvesEqualsWideningThenReducing) {
  // Every bit pattern (NaNs, infinities, subnormals) against float accumulators of mixed signs
  // and magnitudes, with and without a factor, odd counts for the 8-wide path's tail.
  std::vector<uint16_t> halves(65536 + 5);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i * 40503u);
  std::vector<float> start(halves.size());
  for (size_t i = 0; i < start.size(); ++i) start[i] = (static_cast<int>(i % 97) - 48) * 0.37f;
  int bad = 0;
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (double factor : {1.0, 0.37}) {
        for (size_t count : {halves.size(), size_t(1), size_t(13)}) {
          std::vector<float> fused(start.begin(), start.begin() + count), wide(count);
          std::vector<float> want(start.begin(), start.begin() + count);
          AccumulateHalves(fused.data(), halves.data(), count, dtype, op, factor);
          WidenToFloat(wide.data(), halves.data(), count, dtype, factor);
          ReduceInto(want.data(), wide.data(), count, DataType::kFloat32, op);
          for (size_t i = 0; i < count; ++i) {
            if (Bits(fused[i]) != Bits(want[i]) && ++bad <= 3) {
              EXPECT_EQ(Bits(fused[i]), Bits(want[i]));
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
  std::vector<float> acc(4);
  EXPECT_THROW(AccumulateHalves(acc.data(), halves.data(), 4, DataType::kFloat32, ReduceOp::kSum, 1.0),
               InternalError);
}

// Floats that exercise every rounding decision: a stride through all 2^32 patterns, every
// midpoint between neighbouring halves and bfloat16s with its neighbours, and special values.
std::vector<float> ConversionProbes() {
  std::vector<float> probes;
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4093) {
    probes.push_back(FromBits(static_cast<uint32_t>(bits)));
  }
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float low = HalfToFloat(static_cast<uint16_t>(h));
    const float mid = (low + HalfToFloat(static_cast<uint16_t>(h + 1))) / 2;
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      probes.push_back(f);
      probes.push_back(-f);
    }
  }
  for (uint32_t b = 0; b < 0x8000; ++b) {
    const uint32_t mid = (b << 16) | 0x8000;
    for (uint32_t bits : {mid, mid - 1, mid + 1}) {
      probes.push_back(FromBits(bits));
      probes.push_back(FromBits(bits | 0x80000000u));
    }
  }
  for (uint32_t bits : {0x7f800000u, 0xff800000u, 0x7f800001u, 0x7fffffffu, 0xffc00000u,
                        0x7f7fffffu, 0x00000001u, 0x80000001u, 0x477ff000u, 0x477fefffu,
                        0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u}) {
    probes.push_back(FromBits(bits));
  }
  return probes;
}

SO_TEST(NarrowFromFloatMatchesScalarBitForBit) {
  const std::vector<float> probes = ConversionProbes();
  std::vector<uint16_t> out(probes.size());
  int bad = 0;
  NarrowFromFloat(out.data(), probes.data(), probes.size(), DataType::kFloat16, 1.0);
  for (size_t i = 0; i < probes.size(); ++i) {
    const uint16_t want = FloatToHalf(probes[i]);
    if (out[i] != want && ++bad <= 3) {
      ADD_FAILURE("float16 of float bits " + std::to_string(Bits(probes[i])) + ": got " +
                  std::to_string(out[i]) + ", want " + std::to_string(want));
    }
  }
  // One element per call: the portable path.
  for (size_t i = 0; i < probes.size(); ++i) {
    uint16_t one = 0;
    NarrowFromFloat(&one, &probes[i], 1, DataType::kFloat16, 1.0);
    if (one != out[i] && ++bad <= 3) {
      ADD_FAILURE("float16 (portable) of float bits " + std::to_string(Bits(probes[i])) +
                  ": got " + std::to_string(one) + ", want " + std::to_string(out[i]));
    }
  }
  NarrowFromFloat(out.data(), probes.data(), probes.size(), DataType::kBFloat16, 1.0);
  for (size_t i = 0; i < probes.size(); ++i) {
    const uint16_t want = FloatToBFloat16(probes[i]);
    if (out[i] != want && ++bad <= 3) {
      ADD_FAILURE("bfloat16 of float bits " + std::to_string(Bits(probes[i])) + ": got " +
                  std::to_string(out[i]) + ", want " + std::to_string(want));
    }
  }
  EXPECT_EQ(bad, 0);
  // With a factor: the product in float, then rounded.
  NarrowFromFloat(out.data(), probes.data(), probes.size(), DataType::kFloat16, 1.0 / 3);
  for (size_t i = 0; i < probes.size(); i += 101) {
    const float scaled = probes[i] * static_cast<float>(1.0 / 3);
    if (!std::isnan(scaled)) EXPECT_EQ(out[i], FloatToHalf(scaled));
  }
}

SO_TEST(ConversionsRejectNonHalfTypes) {
  float f[1] = {1};
  uint16_t h[1] = {0};
  EXPECT_THROW(WidenToFloat(f, h, 1, DataType::kFloat32, 1.0), InternalError);
  EXPECT_THROW(NarrowFromFloat(h, f, 1, DataType::kInt16, 1.0), InternalError);
}

}  // namespace
}  // namespace scaleout
