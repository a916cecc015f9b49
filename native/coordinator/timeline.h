// Note [Timeline]
// With SCALEOUT_TIMELINE=<file>, rank 0 writes a Chrome trace (open it in chrome://tracing or
// Perfetto): one row per tensor name, with a NEGOTIATE_<COLLECTIVE> span from submission until
// every rank agreed, and a span named after the collective for its execution, whose arguments say
// how many tensors were fused with it and the status. With mark_cycles
// (SCALEOUT_TIMELINE_MARK_CYCLES), an instant event CYCLE_START marks each step of the coordinator
// that executed collectives (scaleout has no fixed cycle: only steps with work are marked). Event
// names are Horovod's: NEGOTIATE_ALLREDUCE, ALLREDUCE, CYCLE_START, ... Written by the coordinator
// thread only, and flushed at the end of each of its steps that wrote events, so that the file
// holds every finished collective while the job runs (one can watch it, or read it after a crash):
// until the timeline is stopped or the runtime shuts down it is an array without its closing
// bracket, as Horovod's, which Chrome's and Perfetto's viewers read; then valid JSON.
// start_timeline()/stop_timeline() open and close it at run time (Coordinator::SetTimeline);
// SCALEOUT_TIMELINE=DYNAMIC opens nothing at init.
#ifndef SCALEOUT_COORDINATOR_TIMELINE_H_
#define SCALEOUT_COORDINATOR_TIMELINE_H_

#include <cstdio>
#include <string>
#include <unordered_map>

#include "common/status.h"

namespace scaleout {

class Timeline {
 public:
  ~Timeline();
  // Starts writing to `path` on rank 0; an empty path (or another rank) leaves it disabled.
  // `now` (monotonic seconds, the clock of every Span) is the trace's time zero.
  Status Open(const std::string& path, int rank, double now, bool mark_cycles);
  bool enabled() const { return file_ != nullptr; }
  bool marks_cycles() const { return file_ != nullptr && mark_cycles_; }
  void MarkCycle(double now);
  // Times are monotonic seconds.
  void Span(const std::string& tensor, const char* name, double start, double end,
            const std::string& args_json = "");
  // Writes out what was written since the last flush.
  void Flush();
  void Close();

 private:
  int RowOf(const std::string& tensor);

  std::FILE* file_ = nullptr;
  double origin_ = 0;
  bool mark_cycles_ = false;
  bool unflushed_ = false;
  std::unordered_map<std::string, int> rows_;
};

// "a\"b" -> "\"a\\\"b\"": a JSON string literal.
std::string JsonString(const std::string& s);

}  // namespace scaleout

#endif  // SCALEOUT_COORDINATOR_TIMELINE_H_
