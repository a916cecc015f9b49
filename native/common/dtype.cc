#include "common/dtype.h"

#include <cstring>
#include <string>

#include "common/status.h"

namespace scaleout {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Drops the low `shift` bits of `value` (0 < shift < 32), rounding to nearest, ties to even.
uint32_t ShiftRightRoundEven(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t dropped = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((dropped > half || (dropped == half && (kept & 1))) ? 1 : 0);
}

}  // namespace

bool IsValidDataType(int value) { return value >= 0 && value < SO_DTYPE_COUNT; }

bool IsValidReduceOp(int value) { return value >= 0 && value < SO_REDUCE_OP_COUNT; }

size_t DataTypeSize(DataType t) {
  switch (static_cast<int>(t)) {
#define SO_SIZE_CASE_(ENUM, name, code, bytes) \
  case SO_##ENUM:                              \
    return bytes;
    SO_DTYPE_TABLE(SO_SIZE_CASE_)
#undef SO_SIZE_CASE_
  }
  CheckFailed(__FILE__, __LINE__, "IsValidDataType(t)",
              "invalid data type " + std::to_string(static_cast<int>(t)));
}

const char* DataTypeName(DataType t) {
  switch (static_cast<int>(t)) {
#define SO_NAME_CASE_(ENUM, name, code, bytes) \
  case SO_##ENUM:                              \
    return #name;
    SO_DTYPE_TABLE(SO_NAME_CASE_)
#undef SO_NAME_CASE_
  }
  return "unknown";  // for diagnostics about bad user input, so no check here
}

const char* ReduceOpName(ReduceOp op) {
  switch (static_cast<int>(op)) {
#define SO_NAME_CASE_(ENUM, name, code) \
  case SO_##ENUM:                       \
    return #name;
    SO_REDUCE_OP_TABLE(SO_NAME_CASE_)
#undef SO_NAME_CASE_
  }
  return "Unknown";
}

bool IsFloatingPoint(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16 || t == DataType::kFloat32 ||
         t == DataType::kFloat64;
}

bool IsHalf(DataType t) { return t == DataType::kFloat16 || t == DataType::kBFloat16; }

// These scalar conversions are the readable reference. The batch versions in
// collectives/reduce_kernels.cc are branch-free so that their loops vectorise; the unit tests
// check that the two agree bit for bit.

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return BitsFloat(FloatBits(magnitude) | sign);
  }
  if (exponent == 0x1f) {
    // Inf (mantissa 0), or NaN: payload kept in the top mantissa bits and the quiet bit set,
    // which is what the hardware conversions (x86 F16C, Arm FCVT) do.
    const uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
    return BitsFloat(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  return BitsFloat(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t bits = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    // NaN: keep the top of the payload and set the quiet bit, so that it cannot become Inf.
    return sign | 0x7e00 | ((magnitude >> 13) & 0x3ff);
  }
  if (magnitude >= 0x477ff000u) {
    // From 65520 (halfway between 65504, the largest half, and 65536) up, and Inf.
    return sign | 0x7c00;
  }
  if (magnitude >= 0x38800000u) {
    // Normal half (from 2^-14): rebias the exponent by 127 - 15 = 112 and round off 13 bits.
    // A mantissa that rounds up carries into the exponent, which is what we want.
    return sign | static_cast<uint16_t>(ShiftRightRoundEven(magnitude - (112u << 23), 13));
  }
  if (magnitude <= 0x33000000u) {
    // At most 2^-25, half of the smallest subnormal: rounds to zero (a tie goes to even 0).
    return sign;
  }
  // Subnormal half: the result is round(value / 2^-24). With the implicit bit, value is
  // significand * 2^(exponent - 150), so the shift is 126 - exponent, between 14 and 24.
  // Rounding up from the largest subnormal gives 0x400, the smallest normal, as it should.
  const int exponent = static_cast<int>(magnitude >> 23);
  const uint32_t significand = (magnitude & 0x7fffff) | 0x800000;
  return sign | static_cast<uint16_t>(ShiftRightRoundEven(significand, 126 - exponent));
}

float BFloat16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBFloat16(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: truncate and set the quiet bit; rounding could carry a payload into Inf.
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  }
  // bfloat16 is the top half of a float32, so rounding off 16 bits is all there is. Overflow
  // carries into the exponent and gives Inf, as round-to-nearest requires.
  return static_cast<uint16_t>(ShiftRightRoundEven(bits, 16));
}

}  // namespace scaleout
