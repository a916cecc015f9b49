#include "coordinator/timeline.h"

#include <cerrno>
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
  std::fputs("[\n", file_);
  return Status::OK();
}

void Timeline::MarkCycle(double now) {
  if (!marks_cycles()) return;
  unflushed_ = true;
  std::fprintf(
      file_,
      "{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\", \"pid\": 0, \"ts\": %.3f},\n",
      (now - origin_) * 1e6);
}

int Timeline::RowOf(const std::string& tensor) {
  auto it = rows_.find(tensor);
  if (it != rows_.end()) return it->second;
  const int row = static_cast<int>(rows_.size()) + 1;
  rows_[tensor] = row;
  std::fprintf(file_,
               "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": "
               "{\"name\": %s}},\n",
               row, JsonString(tensor).c_str());
  return row;
}

void Timeline::Span(const std::string& tensor, const char* name, double start, double end,
                    const std::string& args_json) {
  if (file_ == nullptr) return;
  unflushed_ = true;
  const int row = RowOf(tensor);
  std::fprintf(
      file_,
      "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f",
      name, row, (start - origin_) * 1e6, (end - start) * 1e6);
  if (!args_json.empty()) std::fprintf(file_, ", \"args\": %s", args_json.c_str());
  std::fputs("},\n", file_);
}

void Timeline::Flush() {
  if (file_ == nullptr || !unflushed_) return;
  std::fflush(file_);
  unflushed_ = false;
}

void Timeline::Close() {
  if (file_ == nullptr) return;
  // A last metadata event, so the array needs no trailing-comma fix-up.
  std::fputs(
      "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"name\": \"scaleout "
      "rank 0\"}}\n]\n",
      file_);
  std::fclose(file_);
  file_ = nullptr;
  unflushed_ = false;
}

}  // namespace scaleout
