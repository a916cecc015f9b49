// What this process's collectives moved and how long they reduced and waited, per collective
// kind (scaleout.stats(), scaleoutrun --stats). See Note [Traffic].
//
// Threading: any thread; counters are relaxed atomics, so a reading is not a consistent
// snapshot across counters while collectives run.
#ifndef SCALEOUT_COMMON_TRAFFIC_H_
#define SCALEOUT_COMMON_TRAFFIC_H_

#include <chrono>
#include <cstdint>

#include "c_api/scaleout.h"

namespace scaleout {
namespace traffic {

enum Field {
#define SO_TRAFFIC_FIELD_(ENUM, name, code) k##ENUM = code,
  SO_TRAFFIC_TABLE(SO_TRAFFIC_FIELD_)
#undef SO_TRAFFIC_FIELD_
};

// The collective kind this thread works for from now on (SO_ALLREDUCE ...; -1: none, and
// then Add counts nothing).
void SetKind(int collective);
int Kind();
// Adds to this thread's kind's counter.
void Add(Field field, int64_t value);
// out[collective * SO_TRAFFIC_COUNT + field] for every collective kind.
void Read(int64_t* out);
void Reset();

// Adds the nanoseconds from construction to destruction to a time field.
class Timed {
 public:
  explicit Timed(Field field) : field_(field), start_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    Add(field_, std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - start_)
                    .count());
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  Field field_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace traffic
}  // namespace scaleout

#endif  // SCALEOUT_COMMON_TRAFFIC_H_
