#include "coordinator/timeline.h"

#include <cerrno>
#include <chrono>
#include <cstring>

namespace scaleout {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

Timeline::~Timeline() { Close(); }

Status Timeline::Open(const std::string& path, int rank, double now, bool mark_cycles) {
  Close();
  if (path.empty() || rank != 0) return Status::OK();
  origin_ = now;
  mark_cycles_ = mark_cycles;
  rows_.clear();
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) {
    return Status::InvalidArgument("timeline: cannot write '" + path +
                                   "': " + std::strerror(errno));
  }
  // Process 0 holds the trace's start (wall clock) and the cycle marks; each tensor is a
  // process of its own (RowOf), as in Horovod's files.
  const long long epoch_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
  std::fprintf(file_,
               "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": "
               "{\"name\": \"scaleout rank 0\", \"start_time_since_epoch_in_micros\": %lld}},\n"
               "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": 0, \"args\": "
               "{\"sort_index\": 0}}",
               epoch_us);
  closed_ = false;
  unflushed_ = true;
  Flush();  // a whole (empty) trace from the start
  return Status::OK();
}

void Timeline::Next() {
  if (closed_) {
    std::fseek(file_, -2, SEEK_CUR);  // over the "\n]" the last flush wrote
    closed_ = false;
  }
  unflushed_ = true;
  std::fputs(",\n", file_);
}

void Timeline::MarkCycle(double now) {
  if (!marks_cycles()) return;
  Next();
  std::fprintf(file_,
               "{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\", \"pid\": 0, \"ts\": %.3f}",
               (now - origin_) * 1e6);
}

Timeline::Row& Timeline::RowOf(const std::string& tensor) {
  auto it = rows_.find(tensor);
  if (it != rows_.end()) return it->second;
  Row& row = rows_[tensor];
  row.pid = static_cast<int>(rows_.size());
  Next();
  std::fprintf(
      file_,
      "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": %s}},\n"
      "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"args\": "
      "{\"sort_index\": %d}}",
      row.pid, JsonString(tensor).c_str(), row.pid, row.pid);
  return row;
}

void Timeline::Begin(const std::string& tensor, const std::string& name, double now) {
  if (file_ == nullptr) return;
  Row& row = RowOf(tensor);
  ++row.open;
  Next();
  std::fprintf(file_, "{\"name\": %s, \"ph\": \"B\", \"pid\": %d, \"ts\": %.3f}",
               JsonString(name).c_str(), row.pid, (now - origin_) * 1e6);
}

void Timeline::End(const std::string& tensor, double now, const std::string& args_json) {
  if (file_ == nullptr) return;
  auto it = rows_.find(tensor);
  if (it == rows_.end() || it->second.open == 0) return;  // begun before this file
  --it->second.open;
  Next();
  std::fprintf(file_, "{\"ph\": \"E\", \"pid\": %d, \"ts\": %.3f", it->second.pid,
               (now - origin_) * 1e6);
  if (!args_json.empty()) std::fprintf(file_, ", \"args\": %s", args_json.c_str());
  std::fputs("}", file_);
}

void Timeline::Flush() {
  if (file_ == nullptr || !unflushed_) return;
  std::fputs("\n]", file_);
  std::fflush(file_);
  closed_ = true;
  unflushed_ = false;
}

void Timeline::Close() {
  if (file_ == nullptr) return;
  Flush();
  std::fputs("\n", file_);
  std::fclose(file_);
  file_ = nullptr;
  closed_ = false;
  unflushed_ = false;
}

}  // namespace scaleout
