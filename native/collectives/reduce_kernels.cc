#include "collectives/reduce_kernels.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "common/status.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SCALEOUT_HAVE_F16C_PATH 1
#include <immintrin.h>
#endif

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
// do assume the default rounding mode, round to nearest even. For float16 they stay several
// times slower than memory even vectorised for SSE2 (ReduceInto: 0.35 against 5 Gelem/s), so
// on x86 CPUs with F16C (all since 2012-13) float16 is converted by the hardware instead,
// chosen at run time. Its results are the same bits (a signalling NaN comes out quiet in both)
// and the tests compare both paths with the reference: calls of fewer than 8 elements take the
// portable path.

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
  // Inf, or NaN with its payload and the quiet bit set (as the F16C instruction does).
  const uint32_t inf_nan =
      (magnitude << 13) | 0x7f800000u | Select(magnitude > 0x7c00, 0x00400000u, 0u);
  // Subnormal (and zero): mantissa * 2^-24, exact in float.
  const uint32_t subnormal =
      FloatBits(static_cast<float>(static_cast<int32_t>(magnitude)) * 0x1p-24f);
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
  const uint32_t result =
      Select(magnitude >= 0x477ff000u, big, Select(magnitude < 0x38800000u, subnormal, normal));
  return static_cast<uint16_t>(result | sign);
}

inline float WidenBFloat16(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

inline uint16_t NarrowBFloat16(float f) {
  const uint32_t bits = FloatBits(f);
  const uint32_t rounded = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
  const uint32_t nan = (bits >> 16) | 0x40;
  return static_cast<uint16_t>(Select((bits & 0x7fffffffu) > 0x7f800000u, nan, rounded));
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

// fn(the element operation of op); Average reduces as Sum (its division is a ScaleBuffer).
template <typename Fn>
void WithReduceOp(ReduceOp op, Fn&& fn) {
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
      return fn(AddOp());
    case ReduceOp::kMin:
      return fn(MinOp());
    case ReduceOp::kMax:
      return fn(MaxOp());
    case ReduceOp::kProduct:
      return fn(MultiplyOp());
  }
  CheckFailed(__FILE__, __LINE__, "IsValidReduceOp(op)",
              "invalid reduce op " + std::to_string(static_cast<int>(op)));
}

// fn(a value of the C++ type of dtype) for the dtypes the plain typed loops serve (integers,
// float32, float64); false, calling nothing, for float16, bfloat16, bool and invalid values.
template <typename Fn>
bool WithPlainType(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kUInt8:
      return fn(uint8_t()), true;
    case DataType::kInt8:
      return fn(int8_t()), true;
    case DataType::kInt16:
      return fn(int16_t()), true;
    case DataType::kUInt16:
      return fn(uint16_t()), true;
    case DataType::kInt32:
      return fn(int32_t()), true;
    case DataType::kInt64:
      return fn(int64_t()), true;
    case DataType::kFloat32:
      return fn(float()), true;
    case DataType::kFloat64:
      return fn(double()), true;
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kBool:
      break;
  }
  return false;
}

// ---- ReduceInto ----

template <typename T, typename Op>
void ReduceLoop(T* __restrict__ inout, const T* __restrict__ in, size_t count, Op op) {
  for (size_t i = 0; i < count; ++i) inout[i] = op(inout[i], in[i]);
}

template <typename T>
void ReduceTyped(void* inout_v, const void* in_v, size_t count, ReduceOp op) {
  T* inout = static_cast<T*>(inout_v);
  const T* in = static_cast<const T*>(in_v);
  WithReduceOp(op, [&](auto each) { ReduceLoop(inout, in, count, each); });
}

// ---- half precision: portable loops ----

template <typename Codec, typename Op>
void ReduceHalfLoop(uint16_t* __restrict__ inout, const uint16_t* __restrict__ in, size_t count,
                    Op op) {
  for (size_t i = 0; i < count; ++i) {
    inout[i] = Codec::Narrow(op(Codec::Widen(inout[i]), Codec::Widen(in[i])));
  }
}

template <typename Codec>
void ScaleHalfLoop(uint16_t* __restrict__ buf, size_t count, float factor) {
  for (size_t i = 0; i < count; ++i) buf[i] = Codec::Narrow(Codec::Widen(buf[i]) * factor);
}

// Factor 1 gets its own loop: it saves the multiply (the results are the same bits).
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

template <typename Codec, typename Op>
void AccumulateLoop(float* __restrict__ acc, const uint16_t* __restrict__ src, size_t count,
                    float factor, Op op) {
  if (factor == 1.0f) {
    for (size_t i = 0; i < count; ++i) acc[i] = op(acc[i], Codec::Widen(src[i]));
  } else {
    for (size_t i = 0; i < count; ++i) acc[i] = op(acc[i], Codec::Widen(src[i]) * factor);
  }
}

// ---- float16 on x86 with F16C ----
//
// Each function does whole groups of 8 elements with the conversion instructions and leaves
// the rest (fewer than 8) to the portable loop. The reduction applies the same element
// operation as everywhere else to an 8-float array, which g++ turns into one AVX operation.

#ifdef SCALEOUT_HAVE_F16C_PATH
bool CpuHasF16C() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return has;
}

#define SO_F16C __attribute__((target("avx,f16c")))
constexpr int kF16CRounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

SO_F16C inline __m256 LoadHalf8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

SO_F16C inline void StoreHalf8(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, kF16CRounding));
}

template <typename Op>
SO_F16C void ReduceHalfF16C(uint16_t* __restrict__ inout, const uint16_t* __restrict__ in,
                            size_t count, Op op) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    alignas(32) float a[8];
    alignas(32) float b[8];
    _mm256_store_ps(a, LoadHalf8(inout + i));
    _mm256_store_ps(b, LoadHalf8(in + i));
    for (int j = 0; j < 8; ++j) a[j] = op(a[j], b[j]);
    StoreHalf8(inout + i, _mm256_load_ps(a));
  }
  ReduceHalfLoop<HalfCodec>(inout + i, in + i, count - i, op);
}

SO_F16C void ScaleHalfF16C(uint16_t* buf, size_t count, float factor) {
  const __m256 scale = _mm256_set1_ps(factor);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    StoreHalf8(buf + i, _mm256_mul_ps(LoadHalf8(buf + i), scale));
  }
  ScaleHalfLoop<HalfCodec>(buf + i, count - i, factor);
}

SO_F16C void WidenHalfF16C(float* dst, const uint16_t* src, size_t count, float factor) {
  const __m256 scale = _mm256_set1_ps(factor);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(LoadHalf8(src + i), scale));
  }
  WidenLoop<HalfCodec>(dst + i, src + i, count - i, factor);
}

SO_F16C void NarrowHalfF16C(uint16_t* dst, const float* src, size_t count, float factor) {
  const __m256 scale = _mm256_set1_ps(factor);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    StoreHalf8(dst + i, _mm256_mul_ps(_mm256_loadu_ps(src + i), scale));
  }
  NarrowLoop<HalfCodec>(dst + i, src + i, count - i, factor);
}
// bfloat16 needs no conversion instruction, but narrowing 32-bit lanes to 16 bits does not
// vectorise for SSE2; with AVX2 it does, 8 lanes at a time.
bool CpuHasAVX2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
  }();
  return has;
}

__attribute__((target("avx2"))) void NarrowBFloat16AVX2(uint16_t* dst, const float* src,
                                                        size_t count, float factor) {
  const __m256 scale = _mm256_set1_ps(factor);
  const __m256i one = _mm256_set1_epi32(1), round = _mm256_set1_epi32(0x7fff);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 v = _mm256_loadu_ps(src + i);
    if (factor != 1.0f) v = _mm256_mul_ps(v, scale);
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i high = _mm256_srli_epi32(bits, 16);
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(bits, round), _mm256_and_si256(high, one)), 16);
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), inf);
    const __m256i result = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, quiet), is_nan);
    // Lanes hold values below 0x10000: pack them to 16 bits, then put the two halves together.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  NarrowLoop<BFloat16Codec>(dst + i, src + i, count - i, factor);
}

template <typename Op>
SO_F16C void AccumulateHalfF16C(float* __restrict__ acc, const uint16_t* __restrict__ src,
                                size_t count, float factor, Op op) {
  const __m256 scale = _mm256_set1_ps(factor);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    alignas(32) float b[8];
    __m256 wide = LoadHalf8(src + i);
    if (factor != 1.0f) wide = _mm256_mul_ps(wide, scale);
    if constexpr (std::is_same_v<Op, AddOp>) {
      _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), wide));
    } else {
      _mm256_store_ps(b, wide);
      for (int j = 0; j < 8; ++j) acc[i + j] = op(acc[i + j], b[j]);
    }
  }
  AccumulateLoop<HalfCodec>(acc + i, src + i, count - i, factor, op);
}
#undef SO_F16C
#endif  // SCALEOUT_HAVE_F16C_PATH

// ---- half precision: dispatch ----

template <typename Codec, typename Op>
void ReduceHalfWith(uint16_t* inout, const uint16_t* in, size_t count, Op op) {
#ifdef SCALEOUT_HAVE_F16C_PATH
  if constexpr (std::is_same_v<Codec, HalfCodec>) {
    if (CpuHasF16C()) return ReduceHalfF16C(inout, in, count, op);
  }
#endif
  ReduceHalfLoop<Codec>(inout, in, count, op);
}

template <typename Codec>
void ScaleHalf(uint16_t* buf, size_t count, float factor) {
#ifdef SCALEOUT_HAVE_F16C_PATH
  if constexpr (std::is_same_v<Codec, HalfCodec>) {
    if (CpuHasF16C()) return ScaleHalfF16C(buf, count, factor);
  }
#endif
  ScaleHalfLoop<Codec>(buf, count, factor);
}

template <typename Codec>
void WidenHalfBuffer(float* dst, const uint16_t* src, size_t count, float factor) {
#ifdef SCALEOUT_HAVE_F16C_PATH
  if constexpr (std::is_same_v<Codec, HalfCodec>) {
    if (CpuHasF16C()) return WidenHalfF16C(dst, src, count, factor);
  }
#endif
  WidenLoop<Codec>(dst, src, count, factor);
}

template <typename Codec>
void NarrowHalfBuffer(uint16_t* dst, const float* src, size_t count, float factor) {
#ifdef SCALEOUT_HAVE_F16C_PATH
  if constexpr (std::is_same_v<Codec, HalfCodec>) {
    if (CpuHasF16C()) return NarrowHalfF16C(dst, src, count, factor);
  } else {
    if (CpuHasAVX2()) return NarrowBFloat16AVX2(dst, src, count, factor);
  }
#endif
  NarrowLoop<Codec>(dst, src, count, factor);
}

template <typename Codec, typename Op>
void AccumulateWith(float* acc, const uint16_t* src, size_t count, float factor, Op op) {
#ifdef SCALEOUT_HAVE_F16C_PATH
  if constexpr (std::is_same_v<Codec, HalfCodec>) {
    if (CpuHasF16C()) return AccumulateHalfF16C(acc, src, count, factor, op);
  }
#endif
  AccumulateLoop<Codec>(acc, src, count, factor, op);
}

template <typename Codec>
void Accumulate(float* acc, const uint16_t* src, size_t count, float factor, ReduceOp op) {
  WithReduceOp(op, [&](auto each) { AccumulateWith<Codec>(acc, src, count, factor, each); });
}

template <typename Codec>
void ReduceHalf(void* inout_v, const void* in_v, size_t count, ReduceOp op) {
  uint16_t* inout = static_cast<uint16_t*>(inout_v);
  const uint16_t* in = static_cast<const uint16_t*>(in_v);
  WithReduceOp(op, [&](auto each) { ReduceHalfWith<Codec>(inout, in, count, each); });
}

void ReduceBool(void* inout_v, const void* in_v, size_t count, ReduceOp op) {
  uint8_t* inout = static_cast<uint8_t*>(inout_v);
  const uint8_t* in = static_cast<const uint8_t*>(in_v);
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
    case ReduceOp::kMax:
      return ReduceLoop(inout, in, count, OrOp());
    case ReduceOp::kMin:
    case ReduceOp::kProduct:
      return ReduceLoop(inout, in, count, AndOp());
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

[[noreturn]] void InvalidDataType(DataType dtype, const char* where) {
  CheckFailed(
      __FILE__, __LINE__, "IsValidDataType(dtype)",
      std::string(where) + ": invalid data type " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace

void ReduceInto(void* inout, const void* in, size_t count, DataType dtype, ReduceOp op) {
  if (WithPlainType(dtype, [&](auto t) { ReduceTyped<decltype(t)>(inout, in, count, op); })) {
    return;
  }
  if (dtype == DataType::kFloat16) return ReduceHalf<HalfCodec>(inout, in, count, op);
  if (dtype == DataType::kBFloat16) return ReduceHalf<BFloat16Codec>(inout, in, count, op);
  if (dtype == DataType::kBool) return ReduceBool(inout, in, count, op);
  InvalidDataType(dtype, "ReduceInto");
}

// ---- ReduceFrom ----

namespace {
thread_local bool t_streaming = false;  // Note [Streaming stores]
}  // namespace

StreamingStores::StreamingStores(bool on) : saved_(t_streaming) { t_streaming = on; }
StreamingStores::~StreamingStores() { t_streaming = saved_; }

namespace {
#if defined(__SSE2__)
bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

void StreamSum(float* out, const float* a, const float* b, size_t count) {
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    for (size_t k = 0; k < 16; k += 4) {
      _mm_stream_ps(out + i + k, _mm_add_ps(_mm_loadu_ps(a + i + k), _mm_loadu_ps(b + i + k)));
    }
  }
  _mm_sfence();
  for (; i < count; ++i) out[i] = a[i] + b[i];
}

// 64 bytes a step through 16-byte vectors, stored as they are or streamed (non-temporal, then
// fenced); the tail by memcpy.
template <bool kStream>
void VectorCopy(uint8_t* d, const uint8_t* s, size_t bytes) {
  auto store = [](uint8_t* at, __m128i v) {
    if constexpr (kStream) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(at), v);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(at), v);
    }
  };
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    store(d + i, a);
    store(d + i + 16, b);
    store(d + i + 32, c);
    store(d + i + 48, e);
  }
  if constexpr (kStream) _mm_sfence();
  if (i < bytes) std::memcpy(d + i, s + i, bytes - i);
}
#endif
}  // namespace

template <typename T, typename Op>
void ReduceFromLoop(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b,
                    size_t count, Op op) {
  for (size_t i = 0; i < count; ++i) out[i] = op(a[i], b[i]);
}

template <typename T>
void ReduceFromTyped(void* out_v, const void* a_v, const void* b_v, size_t count, ReduceOp op) {
  T* out = static_cast<T*>(out_v);
  const T* a = static_cast<const T*>(a_v);
  const T* b = static_cast<const T*>(b_v);
  WithReduceOp(op, [&](auto each) { ReduceFromLoop(out, a, b, count, each); });
}

void ReduceFrom(void* out, const void* a, const void* b, size_t count, DataType dtype,
                ReduceOp op) {
#if defined(__SSE2__)
  if (t_streaming && dtype == DataType::kFloat32 &&
      (op == ReduceOp::kSum || op == ReduceOp::kAverage) && Aligned16(out)) {
    return StreamSum(static_cast<float*>(out), static_cast<const float*>(a),
                     static_cast<const float*>(b), count);
  }
#endif
  if (WithPlainType(dtype, [&](auto t) { ReduceFromTyped<decltype(t)>(out, a, b, count, op); })) {
    return;
  }
  if (!IsValidDataType(static_cast<int>(dtype))) InvalidDataType(dtype, "ReduceFrom");
  // Widened, or logical: the two passes.
  CopyBytes(out, a, count * DataTypeSize(dtype));
  ReduceInto(out, b, count, dtype, op);
}

void ScaleBuffer(void* buf, size_t count, DataType dtype, double factor) {
  SO_CHECK(dtype != DataType::kBool, "ScaleBuffer is not defined for bool");
  if (factor == 1.0) return;
  switch (dtype) {
    case DataType::kUInt8:
      return ScaleInteger(static_cast<uint8_t*>(buf), count, factor);
    case DataType::kInt8:
      return ScaleInteger(static_cast<int8_t*>(buf), count, factor);
    case DataType::kInt16:
      return ScaleInteger(static_cast<int16_t*>(buf), count, factor);
    case DataType::kUInt16:
      return ScaleInteger(static_cast<uint16_t*>(buf), count, factor);
    case DataType::kInt32:
      return ScaleInteger(static_cast<int32_t*>(buf), count, factor);
    case DataType::kInt64:
      return ScaleInteger(static_cast<int64_t*>(buf), count, factor);
    case DataType::kFloat16:
      return ScaleHalf<HalfCodec>(static_cast<uint16_t*>(buf), count, static_cast<float>(factor));
    case DataType::kBFloat16:
      return ScaleHalf<BFloat16Codec>(static_cast<uint16_t*>(buf), count,
                                      static_cast<float>(factor));
    case DataType::kFloat32:
      return ScaleFloat(static_cast<float*>(buf), count, static_cast<float>(factor));
    case DataType::kFloat64:
      return ScaleFloat(static_cast<double*>(buf), count, factor);
    case DataType::kBool:
      break;
  }
  InvalidDataType(dtype, "ScaleBuffer");
}

// Note [Copies]
// Measured on this machine's EPYC, copying 128 KiB: glibc memcpy 2.6-3.5 us for most relative
// alignments but 44 us when (dst - src) mod 4096 is 16; a plain 16-byte-vector loop 2.6-4.7 us
// for all. Below a few KiB glibc never takes the rep-movsb path, and its small-copy code is the
// fastest there is.
// On Intel cores rep movsb has no such case (512 KiB in one core's cache: 12.0-13.8 us at
// every dst - src mod 4096 tried, 0, 16, 64, 2048 and 4080), and it is faster than a vector
// loop into shared memory (as fast as glibc's memcpy, which takes it there too): its
// fast-string stores take whole lines without reading them first, where vector stores first
// fetch each line from the core that last read it (the staged algorithms' packing writes lines
// the other ranks have just read). Measured on this VM's Xeon (2026-11-26, two threads on the
// two cores, each copying 512 KiB into its area, which the other then reads; medians of 1500):
// rep movsb 26.6-28.4 us, glibc memcpy 26.7-27.1 us, the 16-byte loop 33.3-34.3 us, a 256-byte
// AVX loop 33.3-33.7 us; reading the other's area 29.5-32 us whichever. So on Intel large copies
// take rep movsb, elsewhere the loop.
constexpr size_t kLoopCopyBytes = 4096;
// The least a streamed copy takes (VectorCopy's 64-byte steps, a one-Sync allreduce's pack: Note
// [Streaming stores]).
constexpr size_t kStreamCopyBytes = 256;

namespace {
bool RepMovsbIsFast() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_is("intel");
#else
  return false;
#endif
}
const bool kRepMovsb = RepMovsbIsFast();
}  // namespace

void CopyBytes(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  if (t_streaming && bytes >= kStreamCopyBytes && Aligned16(dst)) {
    return VectorCopy<true>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), bytes);
  }
#endif
#if defined(__x86_64__) && defined(__GNUC__)
  if (kRepMovsb && bytes >= kLoopCopyBytes) {
    asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(bytes) : : "memory");
    return;
  }
#endif
#if defined(__SSE2__)
  if (bytes >= kLoopCopyBytes) {
    return VectorCopy<false>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), bytes);
  }
#endif
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void WidenToFloat(float* dst, const void* src, size_t count, DataType dtype, double factor) {
  const uint16_t* halves = static_cast<const uint16_t*>(src);
  const float f = static_cast<float>(factor);
  if (dtype == DataType::kFloat16) return WidenHalfBuffer<HalfCodec>(dst, halves, count, f);
  if (dtype == DataType::kBFloat16) return WidenHalfBuffer<BFloat16Codec>(dst, halves, count, f);
  InvalidDataType(dtype, "WidenToFloat (float16 or bfloat16 only)");
}

void AccumulateHalves(float* acc, const void* src, size_t count, DataType dtype, ReduceOp op,
                      double factor) {
  const uint16_t* halves = static_cast<const uint16_t*>(src);
  const float f = static_cast<float>(factor);
  if (dtype == DataType::kFloat16) return Accumulate<HalfCodec>(acc, halves, count, f, op);
  if (dtype == DataType::kBFloat16) return Accumulate<BFloat16Codec>(acc, halves, count, f, op);
  InvalidDataType(dtype, "AccumulateHalves (float16 or bfloat16 only)");
}

void ReduceHalvesOnce(void* out, const std::vector<const uint8_t*>& sources, size_t count,
                      DataType dtype, ReduceOp op, double pre, double post,
                      std::vector<float>* scratch) {
  constexpr size_t kBlock = size_t(16) << 10;  // elements widened at once (64 KiB of float)
  uint8_t* dst = static_cast<uint8_t*>(out);
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = std::min(kBlock, count - begin);
    scratch->resize(n);
    WidenToFloat(scratch->data(), sources[0] + begin * 2, n, dtype, pre);
    for (size_t s = 1; s < sources.size(); ++s) {
      AccumulateHalves(scratch->data(), sources[s] + begin * 2, n, dtype, op, pre);
    }
    NarrowFromFloat(dst + begin * 2, scratch->data(), n, dtype, post);
  }
}

void NarrowFromFloat(void* dst, const float* src, size_t count, DataType dtype, double factor) {
  uint16_t* halves = static_cast<uint16_t*>(dst);
  const float f = static_cast<float>(factor);
  if (dtype == DataType::kFloat16) return NarrowHalfBuffer<HalfCodec>(halves, src, count, f);
  if (dtype == DataType::kBFloat16) return NarrowHalfBuffer<BFloat16Codec>(halves, src, count, f);
  InvalidDataType(dtype, "NarrowFromFloat (float16 or bfloat16 only)");
}

}  // namespace scaleout
