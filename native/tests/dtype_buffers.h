// Buffers of any dtype for the kernel tests (test_reduce_kernels.cc, test_scale_and_convert.cc):
// every dtype and op, and values written into and read out of a dtype's bytes.
#ifndef SCALEOUT_TESTS_DTYPE_BUFFERS_H_
#define SCALEOUT_TESTS_DTYPE_BUFFERS_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/dtype.h"
#include "tests/bits.h"

namespace scaleout {
namespace dtype_buffers {

inline const DataType kAllTypes[] = {DataType::kUInt8,    DataType::kInt8,    DataType::kInt16,
                                     DataType::kInt32,    DataType::kInt64,   DataType::kFloat16,
                                     DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                                     DataType::kBool,     DataType::kUInt16};
inline const ReduceOp kAllOps[] = {ReduceOp::kAverage, ReduceOp::kSum, ReduceOp::kMin,
                                   ReduceOp::kMax, ReduceOp::kProduct};

template <typename T>
inline void Put(std::vector<uint8_t>& bytes, size_t i, T value) {
  std::memcpy(bytes.data() + i * sizeof(T), &value, sizeof(T));
}

template <typename T>
inline T Get(const std::vector<uint8_t>& bytes, size_t i) {
  T value;
  std::memcpy(&value, bytes.data() + i * sizeof(T), sizeof(T));
  return value;
}

// A buffer of `dtype` holding `values` (each must be representable).
inline std::vector<uint8_t> Encode(DataType dtype, const std::vector<double>& values) {
  std::vector<uint8_t> bytes(values.size() * DataTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    switch (dtype) {
      case DataType::kUInt8:
        Put(bytes, i, static_cast<uint8_t>(v));
        break;
      case DataType::kInt8:
        Put(bytes, i, static_cast<int8_t>(v));
        break;
      case DataType::kInt16:
        Put(bytes, i, static_cast<int16_t>(v));
        break;
      case DataType::kUInt16:
        Put(bytes, i, static_cast<uint16_t>(v));
        break;
      case DataType::kInt32:
        Put(bytes, i, static_cast<int32_t>(v));
        break;
      case DataType::kInt64:
        Put(bytes, i, static_cast<int64_t>(v));
        break;
      case DataType::kFloat16:
        Put(bytes, i, FloatToHalf(static_cast<float>(v)));
        break;
      case DataType::kBFloat16:
        Put(bytes, i, FloatToBFloat16(static_cast<float>(v)));
        break;
      case DataType::kFloat32:
        Put(bytes, i, static_cast<float>(v));
        break;
      case DataType::kFloat64:
        Put(bytes, i, v);
        break;
      case DataType::kBool:
        Put(bytes, i, static_cast<uint8_t>(v != 0));
        break;
    }
  }
  return bytes;
}

inline std::vector<double> Decode(DataType dtype, const std::vector<uint8_t>& bytes) {
  std::vector<double> values(bytes.size() / DataTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DataType::kUInt8:
        values[i] = Get<uint8_t>(bytes, i);
        break;
      case DataType::kInt8:
        values[i] = Get<int8_t>(bytes, i);
        break;
      case DataType::kInt16:
        values[i] = Get<int16_t>(bytes, i);
        break;
      case DataType::kUInt16:
        values[i] = Get<uint16_t>(bytes, i);
        break;
      case DataType::kInt32:
        values[i] = Get<int32_t>(bytes, i);
        break;
      case DataType::kInt64:
        values[i] = static_cast<double>(Get<int64_t>(bytes, i));
        break;
      case DataType::kFloat16:
        values[i] = HalfToFloat(Get<uint16_t>(bytes, i));
        break;
      case DataType::kBFloat16:
        values[i] = BFloat16ToFloat(Get<uint16_t>(bytes, i));
        break;
      case DataType::kFloat32:
        values[i] = Get<float>(bytes, i);
        break;
      case DataType::kFloat64:
        values[i] = Get<double>(bytes, i);
        break;
      case DataType::kBool:
        values[i] = Get<uint8_t>(bytes, i);
        break;
    }
  }
  return values;
}

}  // namespace dtype_buffers
}  // namespace scaleout

#endif  // SCALEOUT_TESTS_DTYPE_BUFFERS_H_
