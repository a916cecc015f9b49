// ScaleBuffer, CopyBytes and the batch half-precision conversions, for every dtype.
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

// ---- ScaleBuffer ----

// What ScaleBuffer promises for integers: multiply in double, truncate toward zero, saturate.
double ExpectedIntegerScale(DataType dtype, double v, double factor) {
  double lo = 0, hi = 0;
  switch (dtype) {
    case DataType::kUInt8:
      lo = 0;
      hi = 255;
      break;
    case DataType::kInt8:
      lo = -128;
      hi = 127;
      break;
    case DataType::kInt16:
      lo = -32768;
      hi = 32767;
      break;
    case DataType::kUInt16:
      lo = 0;
      hi = 65535;
      break;
    case DataType::kInt32:
      lo = -2147483648.0;
      hi = 2147483647.0;
      break;
    default:
      lo = -0x1p63;
      hi = 0x1p63;
      break;  // int64: only small values are used
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
          ADD_FAILURE(std::to_string(bytes) + " bytes, src +" + std::to_string(src_off) +
                      ", dst +" + std::to_string(dst_off));
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
  EXPECT_THROW(
      AccumulateHalves(acc.data(), halves.data(), 4, DataType::kFloat32, ReduceOp::kSum, 1.0),
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
      ADD_FAILURE("float16 (portable) of float bits " + std::to_string(Bits(probes[i])) + ": got " +
                  std::to_string(one) + ", want " + std::to_string(out[i]));
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
