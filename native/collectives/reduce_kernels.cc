#include "collectives/reduce_kernels.h"

#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "common/status.h"

// Note [Vectorised kernels]
// Every kernel dispatches on dtype and op once per call and then runs a plain loop over typed
// __restrict__ pointers whose body is branch-free (ternaries on computed values), so that
// g++ -O3 vectorises it without -march flags or intrinsics. The buffers are hundreds of MB,
// so the loops are bound by memory bandwidth once they are vectorised; keep it that way when
// editing (check with -fopt-info-vec-optimized).
//
// Half precision: the conversions below are branch-free twins of the scalar reference in
// common/dtype.cc (the tests check that they agree bit for bit). Their float arithmetic only
// rounds values that are normal in float32, so FTZ/DAZ modes do not change the results; they
// do assume the default rounding mode, round to nearest even.

namespace scaleout {
namespace {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// cond ? a : b, written with masks: with the default -ftrapping-math, g++ will not if-convert a
// ternary whose arms hold float operations (they might raise flags), and then the loop does
// not vectorise. Here every arm is computed unconditionally and there is nothing to convert.
template <typename U>
inline U Select(bool cond, U a, U b) {
  static_assert(std::is_unsigned_v<U>, "Select works on unsigned integers");
  const U mask = static_cast<U>(U(0) - static_cast<U>(cond));
  return static_cast<U>((a & mask) | (b & static_cast<U>(~mask)));
}

inline float WidenHalf(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t magnitude = h & 0x7fff;
  const uint32_t normal = (magnitude << 13) + (112u << 23);  // rebias the exponent by 127 - 15
  const uint32_t inf_nan = (magnitude << 13) | 0x7f800000u;
  // Subnormal (and zero): mantissa * 2^-24, exact in float.
  const uint32_t subnormal = FloatBits(static_cast<float>(static_cast<int32_t>(magnitude)) * 0x1p-24f);
  const uint32_t bits =
      Select(magnitude < 0x400, subnormal, Select(magnitude >= 0x7c00, inf_nan, normal));
  return BitsFloat(bits | sign);
}

inline uint16_t NarrowHalf(float f) {
  const uint32_t bits = FloatBits(f);
  const uint32_t sign = (bits >> 16) & 0x8000;
  const uint32_t magnitude = bits & 0x7fffffffu;
  // Normal half: rebias, then add just under half an ulp plus the ulp's parity and truncate:
  // round to nearest, ties to even.
  const uint32_t normal = (magnitude - (112u << 23) + 0xfff + ((magnitude >> 13) & 1)) >> 13;
  // Subnormal half: adding 0.5f makes the FPU round the value to a multiple of 2^-24 (the ulp
  // of 0.5f), ties to even; the low mantissa bits of the sum are then the half's mantissa.
  const uint32_t subnormal = FloatBits(BitsFloat(magnitude) + 0.5f) - FloatBits(0.5f);
  const uint32_t nan = 0x7e00 | ((magnitude >> 13) & 0x3ff);
  const uint32_t big = Select(magnitude > 0x7f800000u, nan, 0x7c00u);  // NaN, or Inf/overflow
  const uint32_t result = Select(magnitude >= 0x477ff000u, big,
                                 Select(magnitude < 0x38800000u, subnormal, normal));
  return static_cast<uint16_t>(result | sign);
}

inline float WidenBFloat16(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

inline uint16_t NarrowBFloat16(float f) {
  const uint32_t bits = FloatBits(f);
  const uint32_t rounded = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
  const uint32_t nan = (bits >> 16) | 0x40;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

struct HalfCodec {
  static float Widen(uint16_t v) { return WidenHalf(v); }
  static uint16_t Narrow(float v) { return NarrowHalf(v); }
};

struct BFloat16Codec {
  static float Widen(uint16_t v) { return WidenBFloat16(v); }
  static uint16_t Narrow(float v) { return NarrowBFloat16(v); }
};

// ---- element operations ----
//
// Integers wrap on overflow (computed in the unsigned type: no undefined behaviour).
// Floating-point Min and Max propagate NaN, as numpy.minimum and torch.minimum do, so a NaN
// on any rank is seen by all.

template <typename T>
using WrapType = std::common_type_t<std::make_unsigned_t<T>, unsigned>;  // no promotion to int

struct AddOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b));
    } else {
      return a + b;
    }
  }
};

struct MultiplyOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<WrapType<T>>(a) * static_cast<WrapType<T>>(b));
    } else {
      return a * b;
    }
  }
};

struct MinOp {
  template <typename T>
  T operator()(T a, T b) const {
    const T m = b < a ? b : a;
    if constexpr (std::is_floating_point_v<T>) return b != b ? b : m;  // NaN in b
    return m;  // a NaN in a is kept by the comparison
  }
};

struct MaxOp {
  template <typename T>
  T operator()(T a, T b) const {
    const T m = a < b ? b : a;
    if constexpr (std::is_floating_point_v<T>) return b != b ? b : m;
    return m;
  }
};

// bool is one byte per element; any nonzero byte counts as true and results are 0 or 1.
struct OrOp {
  uint8_t operator()(uint8_t a, uint8_t b) const { return (a | b) != 0; }
};

struct AndOp {
  uint8_t operator()(uint8_t a, uint8_t b) const { return (a != 0) & (b != 0); }
};

// ---- ReduceInto ----

template <typename T, typename Op>
void ReduceLoop(T* __restrict__ inout, const T* __restrict__ in, size_t count, Op op) {
  for (size_t i = 0; i < count; ++i) inout[i] = op(inout[i], in[i]);
}

template <typename T>
void ReduceTyped(void* inout_v, const void* in_v, size_t count, ReduceOp op) {
  T* inout = static_cast<T*>(inout_v);
  const T* in = static_cast<const T*>(in_v);
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum: return ReduceLoop(inout, in, count, AddOp());
    case ReduceOp::kMin: return ReduceLoop(inout, in, count, MinOp());
    case ReduceOp::kMax: return ReduceLoop(inout, in, count, MaxOp());
    case ReduceOp::kProduct: return ReduceLoop(inout, in, count, MultiplyOp());
  }
  CheckFailed(__FILE__, __LINE__, "IsValidReduceOp(op)",
              "invalid reduce op " + std::to_string(static_cast<int>(op)));
}

template <typename Codec, typename Op>
void ReduceHalfLoop(uint16_t* __restrict__ inout, const uint16_t* __restrict__ in, size_t count,
                    Op op) {
  for (size_t i = 0; i < count; ++i) {
    inout[i] = Codec::Narrow(op(Codec::Widen(inout[i]), Codec::Widen(in[i])));
  }
}

template <typename Codec>
void ReduceHalf(void* inout_v, const void* in_v, size_t count, ReduceOp op) {
  uint16_t* inout = static_cast<uint16_t*>(inout_v);
  const uint16_t* in = static_cast<const uint16_t*>(in_v);
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum: return ReduceHalfLoop<Codec>(inout, in, count, AddOp());
    case ReduceOp::kMin: return ReduceHalfLoop<Codec>(inout, in, count, MinOp());
    case ReduceOp::kMax: return ReduceHalfLoop<Codec>(inout, in, count, MaxOp());
    case ReduceOp::kProduct: return ReduceHalfLoop<Codec>(inout, in, count, MultiplyOp());
  }
  CheckFailed(__FILE__, __LINE__, "IsValidReduceOp(op)",
              "invalid reduce op " + std::to_string(static_cast<int>(op)));
}

void ReduceBool(void* inout_v, const void* in_v, size_t count, ReduceOp op) {
  uint8_t* inout = static_cast<uint8_t*>(inout_v);
  const uint8_t* in = static_cast<const uint8_t*>(in_v);
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
    case ReduceOp::kMax: return ReduceLoop(inout, in, count, OrOp());
    case ReduceOp::kMin:
    case ReduceOp::kProduct: return ReduceLoop(inout, in, count, AndOp());
  }
  CheckFailed(__FILE__, __LINE__, "IsValidReduceOp(op)",
              "invalid reduce op " + std::to_string(static_cast<int>(op)));
}

// ---- ScaleBuffer ----

template <typename T>
void ScaleFloat(T* __restrict__ buf, size_t count, T factor) {
  for (size_t i = 0; i < count; ++i) buf[i] *= factor;
}

// Truncates toward zero. Out-of-range values saturate and NaN gives 0, because converting
// such a double to an integer is undefined behaviour in C++.
template <typename T>
inline T TruncateToInteger(double v) {
  constexpr double kLowest = static_cast<double>(std::numeric_limits<T>::min());
  if constexpr (std::numeric_limits<T>::digits < std::numeric_limits<double>::digits) {
    // max is exact in double: clamp, then convert (this form vectorises).
    constexpr double kMax = static_cast<double>(std::numeric_limits<T>::max());
    double c = v == v ? v : 0.0;
    c = c < kLowest ? kLowest : c;
    c = c > kMax ? kMax : c;
    return static_cast<T>(c);
  } else {
    // int64: double(max) rounds up to 2^63, which is out of range, so compare against 2^63.
    using U = std::make_unsigned_t<T>;
    constexpr double kLimit = static_cast<double>(std::numeric_limits<T>::max() / 2 + 1) * 2.0;
    const bool in_range = (v > kLowest) & (v < kLimit);  // false for NaN
    const U truncated = static_cast<U>(static_cast<T>(in_range ? v : 0.0));
    const U saturated =
        Select(v >= kLimit, static_cast<U>(std::numeric_limits<T>::max()),
               Select(v <= kLowest, static_cast<U>(std::numeric_limits<T>::min()), U(0)));
    return static_cast<T>(Select(in_range, truncated, saturated));
  }
}

template <typename T>
void ScaleInteger(T* __restrict__ buf, size_t count, double factor) {
  for (size_t i = 0; i < count; ++i) {
    buf[i] = TruncateToInteger<T>(static_cast<double>(buf[i]) * factor);
  }
}

template <typename Codec>
void ScaleHalf(uint16_t* __restrict__ buf, size_t count, float factor) {
  for (size_t i = 0; i < count; ++i) buf[i] = Codec::Narrow(Codec::Widen(buf[i]) * factor);
}

// Factor 1 gets its own loop: it saves the multiply, and the conversion stays exact to the bit
// (a multiply would quieten signalling NaNs).
template <typename Codec>
void WidenLoop(float* __restrict__ dst, const uint16_t* __restrict__ src, size_t count,
               float factor) {
  if (factor == 1.0f) {
    for (size_t i = 0; i < count; ++i) dst[i] = Codec::Widen(src[i]);
  } else {
    for (size_t i = 0; i < count; ++i) dst[i] = Codec::Widen(src[i]) * factor;
  }
}

template <typename Codec>
void NarrowLoop(uint16_t* __restrict__ dst, const float* __restrict__ src, size_t count,
                float factor) {
  if (factor == 1.0f) {
    for (size_t i = 0; i < count; ++i) dst[i] = Codec::Narrow(src[i]);
  } else {
    for (size_t i = 0; i < count; ++i) dst[i] = Codec::Narrow(src[i] * factor);
  }
}

[[noreturn]] void InvalidDataType(DataType dtype, const char* where) {
  CheckFailed(__FILE__, __LINE__, "IsValidDataType(dtype)",
              std::string(where) + ": invalid data type " +
                  std::to_string(static_cast<int>(dtype)));
}

}  // namespace

void ReduceInto(void* inout, const void* in, size_t count, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8: return ReduceTyped<uint8_t>(inout, in, count, op);
    case DataType::kInt8: return ReduceTyped<int8_t>(inout, in, count, op);
    case DataType::kInt16: return ReduceTyped<int16_t>(inout, in, count, op);
    case DataType::kInt32: return ReduceTyped<int32_t>(inout, in, count, op);
    case DataType::kInt64: return ReduceTyped<int64_t>(inout, in, count, op);
    case DataType::kFloat16: return ReduceHalf<HalfCodec>(inout, in, count, op);
    case DataType::kBFloat16: return ReduceHalf<BFloat16Codec>(inout, in, count, op);
    case DataType::kFloat32: return ReduceTyped<float>(inout, in, count, op);
    case DataType::kFloat64: return ReduceTyped<double>(inout, in, count, op);
    case DataType::kBool: return ReduceBool(inout, in, count, op);
  }
  InvalidDataType(dtype, "ReduceInto");
}

void ScaleBuffer(void* buf, size_t count, DataType dtype, double factor) {
  SO_CHECK(dtype != DataType::kBool, "ScaleBuffer is not defined for bool");
  if (factor == 1.0) return;
  switch (dtype) {
    case DataType::kUInt8: return ScaleInteger(static_cast<uint8_t*>(buf), count, factor);
    case DataType::kInt8: return ScaleInteger(static_cast<int8_t*>(buf), count, factor);
    case DataType::kInt16: return ScaleInteger(static_cast<int16_t*>(buf), count, factor);
    case DataType::kInt32: return ScaleInteger(static_cast<int32_t*>(buf), count, factor);
    case DataType::kInt64: return ScaleInteger(static_cast<int64_t*>(buf), count, factor);
    case DataType::kFloat16:
      return ScaleHalf<HalfCodec>(static_cast<uint16_t*>(buf), count, static_cast<float>(factor));
    case DataType::kBFloat16:
      return ScaleHalf<BFloat16Codec>(static_cast<uint16_t*>(buf), count,
                                      static_cast<float>(factor));
    case DataType::kFloat32:
      return ScaleFloat(static_cast<float*>(buf), count, static_cast<float>(factor));
    case DataType::kFloat64: return ScaleFloat(static_cast<double*>(buf), count, factor);
    case DataType::kBool: break;
  }
  InvalidDataType(dtype, "ScaleBuffer");
}

void WidenToFloat(float* dst, const void* src, size_t count, DataType dtype, double factor) {
  const uint16_t* halves = static_cast<const uint16_t*>(src);
  const float f = static_cast<float>(factor);
  if (dtype == DataType::kFloat16) return WidenLoop<HalfCodec>(dst, halves, count, f);
  if (dtype == DataType::kBFloat16) return WidenLoop<BFloat16Codec>(dst, halves, count, f);
  InvalidDataType(dtype, "WidenToFloat (float16 or bfloat16 only)");
}

void NarrowFromFloat(void* dst, const float* src, size_t count, DataType dtype, double factor) {
  uint16_t* halves = static_cast<uint16_t*>(dst);
  const float f = static_cast<float>(factor);
  if (dtype == DataType::kFloat16) return NarrowLoop<HalfCodec>(halves, src, count, f);
  if (dtype == DataType::kBFloat16) return NarrowLoop<BFloat16Codec>(halves, src, count, f);
  InvalidDataType(dtype, "NarrowFromFloat (float16 or bfloat16 only)");
}

}  // namespace scaleout
