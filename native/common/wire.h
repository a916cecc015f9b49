// Little helpers to encode control messages as bytes (native endianness: every rank of a job
// runs the same build on the same kind of machine).
#ifndef SCALEOUT_COMMON_WIRE_H_
#define SCALEOUT_COMMON_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/status.h"

namespace scaleout {

class WireWriter {
 public:
  // Room for a typical control message at once, not a reallocation per field.
  WireWriter() { bytes_.reserve(256); }
  template <typename T>
  void Put(T value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  template <typename T>
  void PutVector(const std::vector<T>& v) {
    Put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (const T& x : v) Put<T>(x);
  }
  std::vector<uint8_t> Take() { return std::move(bytes_); }
  size_t size() const { return bytes_.size(); }

 private:
  std::vector<uint8_t> bytes_;
};

// Reads what WireWriter wrote; a truncated message is an internal error (SO_CHECK).
class WireReader {
 public:
  explicit WireReader(const std::vector<uint8_t>& bytes)
      : data_(bytes.data()), size_(bytes.size()) {}
  template <typename T>
  T Get() {
    SO_CHECK(pos_ + sizeof(T) <= size_, "truncated control message");
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string GetString() {
    uint32_t n = Get<uint32_t>();
    SO_CHECK(pos_ + n <= size_, "truncated control message");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> GetVector() {
    uint32_t n = Get<uint32_t>();
    std::vector<T> v;
    v.reserve(n);
    for (uint32_t i = 0; i < n; ++i) v.push_back(Get<T>());
    return v;
  }
  bool done() const { return pos_ == size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace scaleout

#endif  // SCALEOUT_COMMON_WIRE_H_
