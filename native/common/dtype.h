// Element types and the half-precision conversions the core needs.
#ifndef SCALEOUT_COMMON_DTYPE_H_
#define SCALEOUT_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "c_api/scaleout.h"

namespace scaleout {

enum class DataType : int32_t {
  kUInt8 = SO_UINT8,
  kInt8 = SO_INT8,
  kInt16 = SO_INT16,
  kInt32 = SO_INT32,
  kInt64 = SO_INT64,
  kFloat16 = SO_FLOAT16,
  kBFloat16 = SO_BFLOAT16,
  kFloat32 = SO_FLOAT32,
  kFloat64 = SO_FLOAT64,
  kBool = SO_BOOL,
  kUInt16 = SO_UINT16,
};

enum class ReduceOp : int32_t {
  kAverage = SO_AVERAGE,
  kSum = SO_SUM,
  kMin = SO_MIN,
  kMax = SO_MAX,
  kProduct = SO_PRODUCT,
  kAdasum = SO_ADASUM,
};

bool IsValidDataType(int value);
bool IsValidReduceOp(int value);
size_t DataTypeSize(DataType t);
const char* DataTypeName(DataType t);   // "float32", ...
const char* ReduceOpName(ReduceOp op);  // "Average", ...
bool IsFloatingPoint(DataType t);       // float16, bfloat16, float32, float64
bool IsHalf(DataType t);                // float16, bfloat16: reduced in float32

// IEEE-754 binary16 and bfloat16 <-> float32, round to nearest even, NaN and Inf preserved.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace scaleout

#endif  // SCALEOUT_COMMON_DTYPE_H_
