// Note [Timeline]
// With SCALEOUT_TIMELINE=<file> (or HOROVOD_TIMELINE), rank 0 writes a Chrome trace (open it in
// chrome://tracing or Perfetto) laid out as Horovod 0.28.1's: each tensor name is a process of
// the trace (process_name and process_sort_index metadata, in order of first appearance), on
// which a NEGOTIATE_<COLLECTIVE> span begins when rank 0 submits the tensor and ends when every
// rank has agreed, and a span named after the collective (ALLREDUCE, ...) covers its execution,
// ending with its dtype, shape, how many tensors were fused with it and the status. Spans are
// begin and end events written as they happen, so a collective still negotiating or running
// (a hang, or a crash) shows as a span without its end. With mark_cycles
// (SCALEOUT_TIMELINE_MARK_CYCLES), an instant event CYCLE_START marks each step of the
// coordinator that executed collectives (scaleout has no fixed cycle: only steps with work are
// marked). Written by the coordinator thread only, and flushed at the end of each of its steps
// that wrote events; after each flush the file is a whole JSON array (each flush closes it with
// `]`, which the next event overwrites, as Horovod's writer does), so one can watch it while the
// job runs, or read it after a crash, with any JSON reader. Not written: Horovod's per-rank
// readiness marks inside the negotiation and its nested activities (MEMCPY_IN_FUSION_BUFFER, ...).
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
  // `now` (monotonic seconds, the clock of every event) is the trace's time zero.
  Status Open(const std::string& path, int rank, double now, bool mark_cycles);
  bool enabled() const { return file_ != nullptr; }
  bool marks_cycles() const { return file_ != nullptr && mark_cycles_; }
  void MarkCycle(double now);
  // A span of `tensor`'s row begins (`name`: NEGOTIATE_ALLREDUCE, ALLREDUCE, ...) or ends (the
  // row's latest open span; nothing when none is open, e.g. one begun before the file was
  // opened). Times are monotonic seconds; `args_json` a JSON object or empty.
  void Begin(const std::string& tensor, const std::string& name, double now);
  void End(const std::string& tensor, double now, const std::string& args_json = "");
  // Writes out what was written since the last flush, leaving the file a whole JSON array.
  void Flush();
  void Close();

 private:
  struct Row {
    int pid = 0;
    int open = 0;  // spans begun and not ended
  };
  Row& RowOf(const std::string& tensor);
  // Starts the next event: the separator, over the `]` of the last flush.
  void Next();

  std::FILE* file_ = nullptr;
  double origin_ = 0;
  bool mark_cycles_ = false;
  bool unflushed_ = false;
  bool closed_ = false;  // the file ends with the `]` Flush wrote
  std::unordered_map<std::string, Row> rows_;
};

// "a\"b" -> "\"a\\\"b\"": a JSON string literal.
std::string JsonString(const std::string& s);

}  // namespace scaleout

#endif  // SCALEOUT_COORDINATOR_TIMELINE_H_
