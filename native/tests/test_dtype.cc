// Status names, the check macro, dtype metadata and the scalar half-precision conversions.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "common/dtype.h"
#include "common/status.h"
#include "tests/bits.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

bool IsHalfNaN(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool IsBFloat16NaN(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

SO_TEST(StatusNameCoversEveryCode) {
  const char* expected[] = {"OK",       "INVALID_ARGUMENT", "NOT_INITIALIZED", "SHUT_DOWN",
                            "MISMATCH", "DUPLICATE_NAME",   "TRANSPORT",       "TIMEOUT",
                            "INTERNAL", "UNKNOWN_HANDLE",   "DEADLOCK",        "NOT_SUPPORTED"};
  static_assert(sizeof(expected) / sizeof(expected[0]) == SO_STATUS_COUNT);
  for (int code = 0; code < SO_STATUS_COUNT; ++code) {
    EXPECT_EQ(std::string(StatusName(code)), expected[code]);
  }
  EXPECT_EQ(std::string(StatusName(-1)), "UNKNOWN");
  EXPECT_EQ(std::string(StatusName(SO_STATUS_COUNT)), "UNKNOWN");
  EXPECT_EQ(std::string(StatusName(12345)), "UNKNOWN");
}

SO_TEST(StatusFactoriesSetCodes) {
  EXPECT_TRUE(Status().ok());
  EXPECT_TRUE(Status::OK().ok());
  Status s = Status::Mismatch("rank 1 sent float32");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), SO_ERR_MISMATCH);
  EXPECT_EQ(s.message(), "rank 1 sent float32");
  EXPECT_EQ(Status::Timeout("t").code(), SO_ERR_TIMEOUT);
  EXPECT_EQ(Status::Internal("i").code(), SO_ERR_INTERNAL);
}

SO_TEST(CheckFailedMessageHasFileLineExpressionAndMessage) {
  std::string message;
  try {
    CheckFailed("native/x.cc", 42, "count > 0", "empty buffer");
  } catch (const InternalError& e) {
    message = e.message;
  }
  EXPECT_EQ(message, "native/x.cc:42: check failed: count > 0: empty buffer");
}

SO_TEST(CheckMacroThrowsOnlyWhenFalse) {
  int evaluations = 0;
  SO_CHECK(++evaluations == 1, "not thrown");
  EXPECT_EQ(evaluations, 1);
  std::string message;
  const int line = __LINE__ + 2;
  try {
    SO_CHECK(evaluations == 2, std::string("evaluations=") + std::to_string(evaluations));
  } catch (const InternalError& e) {
    message = e.message;
  }
  EXPECT_EQ(message, std::string(__FILE__) + ":" + std::to_string(line) +
                         ": check failed: evaluations == 2: evaluations=1");
}

SO_TEST(DataTypeMetadata) {
  struct Row {
    DataType type;
    size_t size;
    const char* name;
    bool floating;
    bool half;
  };
  const Row rows[] = {
      {DataType::kUInt8, 1, "uint8", false, false},
      {DataType::kInt8, 1, "int8", false, false},
      {DataType::kInt16, 2, "int16", false, false},
      {DataType::kInt32, 4, "int32", false, false},
      {DataType::kInt64, 8, "int64", false, false},
      {DataType::kFloat16, 2, "float16", true, true},
      {DataType::kBFloat16, 2, "bfloat16", true, true},
      {DataType::kFloat32, 4, "float32", true, false},
      {DataType::kFloat64, 8, "float64", true, false},
      {DataType::kBool, 1, "bool", false, false},
      {DataType::kUInt16, 2, "uint16", false, false},
  };
  static_assert(sizeof(rows) / sizeof(rows[0]) == SO_DTYPE_COUNT);
  for (const Row& row : rows) {
    EXPECT_TRUE(IsValidDataType(static_cast<int>(row.type)));
    EXPECT_EQ(DataTypeSize(row.type), row.size);
    EXPECT_EQ(std::string(DataTypeName(row.type)), row.name);
    EXPECT_EQ(IsFloatingPoint(row.type), row.floating);
    EXPECT_EQ(IsHalf(row.type), row.half);
  }
  EXPECT_FALSE(IsValidDataType(-1));
  EXPECT_FALSE(IsValidDataType(SO_DTYPE_COUNT));
  EXPECT_THROW(DataTypeSize(static_cast<DataType>(SO_DTYPE_COUNT)), InternalError);
  EXPECT_EQ(std::string(DataTypeName(static_cast<DataType>(99))), "unknown");
}

SO_TEST(ReduceOpMetadata) {
  const char* names[] = {"Average", "Sum", "Min", "Max", "Product", "Adasum"};
  static_assert(sizeof(names) / sizeof(names[0]) == SO_REDUCE_OP_COUNT);
  for (int op = 0; op < SO_REDUCE_OP_COUNT; ++op) {
    EXPECT_TRUE(IsValidReduceOp(op));
    EXPECT_EQ(std::string(ReduceOpName(static_cast<ReduceOp>(op))), names[op]);
  }
  EXPECT_EQ(static_cast<int>(ReduceOp::kSum), SO_SUM);
  EXPECT_FALSE(IsValidReduceOp(-1));
  EXPECT_FALSE(IsValidReduceOp(SO_REDUCE_OP_COUNT));
}

// ---- float16 ----

SO_TEST(HalfToFloatKnownValues) {
  EXPECT_EQ(HalfToFloat(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)) && HalfToFloat(0x8000) == 0.0f);
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0400), 0x1p-14f);         // smallest normal
  EXPECT_EQ(HalfToFloat(0x03ff), 1023 * 0x1p-24f);  // largest subnormal
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);         // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x8001), -0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7c01)));  // signalling NaN, smallest payload
  EXPECT_TRUE(std::isnan(HalfToFloat(0xfe00)));
  // NaN keeps its sign and payload and comes out quiet, as from the hardware instructions.
  EXPECT_EQ(Bits(HalfToFloat(0x7c01)), 0x7fc02000u);
  EXPECT_EQ(Bits(HalfToFloat(0xfe00)), 0xffc00000u);
  EXPECT_EQ(Bits(HalfToFloat(0x7dff)), 0x7fffe000u);
}

SO_TEST(HalfRoundTripsAllBitPatterns) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const float f = HalfToFloat(half);
    if (IsHalfNaN(half)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(IsHalfNaN(FloatToHalf(f)));
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0);
    } else {
      EXPECT_EQ(FloatToHalf(f), half);
    }
  }
}

SO_TEST(FloatToHalfKnownValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-1.5f), 0xbe00);
  EXPECT_EQ(FloatToHalf(0.1f), 0x2e66);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);  // below the midpoint to 65536
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);   // the midpoint: ties to even, which is Inf
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(FloatToHalf(inf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-inf), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::min()), 0x0000);
}

SO_TEST(FloatToHalfRoundsTiesToEven) {
  // Between 1 and 1 + 2^-10 (the next half); midpoint 1 + 2^-11.
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);      // tie: down to even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie: up to even
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3c01);
  EXPECT_EQ(FloatToHalf(-(1.0f + 0x1p-11f)), 0xbc00);
  // Subnormals, in units of 2^-24.
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);  // 0.5 -> 0
  EXPECT_EQ(FloatToHalf(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalf(3 * 0x1p-25f), 0x0002);        // 1.5 -> 2
  EXPECT_EQ(FloatToHalf(5 * 0x1p-25f), 0x0002);        // 2.5 -> 2
  EXPECT_EQ(FloatToHalf(1023.5f * 0x1p-24f), 0x0400);  // up into the normals
  EXPECT_EQ(FloatToHalf(1022.5f * 0x1p-24f), 0x03fe);
  // Carry from the mantissa into the exponent: 2 - 2^-12 is above the midpoint below 2.
  EXPECT_EQ(FloatToHalf(2.0f - 0x1p-12f), 0x4000);
}

// Every midpoint between neighbouring finite halves, and one float either side of it.
SO_TEST(FloatToHalfRoundsEveryMidpoint) {
  for (uint16_t h = 0; h < 0x7bff; ++h) {
    const float low = HalfToFloat(h);
    const float high = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = (low + high) / 2;  // exact: needs one bit more than a half has
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : h;
    EXPECT_EQ(FloatToHalf(mid), even);
    EXPECT_EQ(FloatToHalf(std::nextafter(mid, 0.0f)), h);
    EXPECT_EQ(FloatToHalf(std::nextafter(mid, 1e9f)), h + 1);
    EXPECT_EQ(FloatToHalf(-mid), even | 0x8000);
  }
}

SO_TEST(FloatToHalfKeepsNaN) {
  const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0xffc00000u,
                           0xff800001u, 0x7f801fffu, 0x7fffffffu};
  for (uint32_t bits : nans) {
    const uint16_t h = FloatToHalf(FromBits(bits));
    EXPECT_TRUE(IsHalfNaN(h));
    EXPECT_EQ((h & 0x8000) != 0, (bits & 0x80000000u) != 0);
  }
  EXPECT_TRUE(IsHalfNaN(FloatToHalf(std::numeric_limits<float>::quiet_NaN())));
}

// ---- bfloat16 ----

SO_TEST(BFloat16KnownValues) {
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xc040), -3.0f);
  EXPECT_EQ(BFloat16ToFloat(0x7f7f), 0x1.fep127f);  // largest finite
  EXPECT_EQ(BFloat16ToFloat(0x0001), 0x1p-133f);    // smallest subnormal
  EXPECT_EQ(BFloat16ToFloat(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(0x7fc0)));
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16(0.1f), 0x3dcd);                // 0x3dcccccd rounds up
  EXPECT_EQ(FloatToBFloat16(1.0f + 0x1p-8f), 0x3f80);      // tie: down to even
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie: up to even
  EXPECT_EQ(FloatToBFloat16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to Inf
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00008000u)), 0x0000);  // subnormal tie: to even
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00018000u)), 0x0002);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00008001u)), 0x0001);
}

SO_TEST(BFloat16RoundTripsAllBitPatterns) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t bf = static_cast<uint16_t>(b);
    const float f = BFloat16ToFloat(bf);
    EXPECT_EQ(Bits(f), b << 16);
    if (IsBFloat16NaN(bf)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(f)));
    } else {
      EXPECT_EQ(FloatToBFloat16(f), bf);
    }
  }
}

SO_TEST(BFloat16RoundsEveryMidpoint) {
  for (uint16_t b = 0; b < 0x7f7f; ++b) {
    const uint32_t mid = (static_cast<uint32_t>(b) << 16) | 0x8000;
    const uint16_t even = (b & 1) ? static_cast<uint16_t>(b + 1) : b;
    EXPECT_EQ(FloatToBFloat16(FromBits(mid)), even);
    EXPECT_EQ(FloatToBFloat16(FromBits(mid - 1)), b);
    EXPECT_EQ(FloatToBFloat16(FromBits(mid + 1)), b + 1);
    EXPECT_EQ(FloatToBFloat16(FromBits(mid | 0x80000000u)), even | 0x8000);
  }
}

SO_TEST(FloatToBFloat16KeepsNaN) {
  // 0x7f800001 and 0x7fffffff would round to Inf or wrap if NaN were not handled apart.
  const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0x7fffffffu, 0xff800001u};
  for (uint32_t bits : nans) {
    const uint16_t b = FloatToBFloat16(FromBits(bits));
    EXPECT_TRUE(IsBFloat16NaN(b));
    EXPECT_EQ((b & 0x8000) != 0, (bits & 0x80000000u) != 0);
  }
}

}  // namespace
}  // namespace scaleout
