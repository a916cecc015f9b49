#include "common/config.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <string>

namespace scaleout {
namespace {

// Reads a number from the environment; absent leaves *out unchanged.
Status ReadNumber(const char* var, double min_value, double* out) {
  const char* raw = std::getenv(var);
  if (raw == nullptr || *raw == '\0') return Status::OK();
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(raw, &end);
  if (errno != 0 || end == raw || *end != '\0' || !(value >= min_value)) {
    std::ostringstream msg;
    msg << var << "='" << raw << "' is not a number >= " << min_value;
    return Status::InvalidArgument(msg.str());
  }
  *out = value;
  return Status::OK();
}

// "3,7,11" -> {3, 7, 11}; absent or empty leaves *out empty.
Status ReadCpuList(const char* var, std::vector<int>* out) {
  const char* raw = std::getenv(var);
  if (raw == nullptr) return Status::OK();
  std::stringstream in(raw);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    char* end = nullptr;
    long cpu = std::strtol(item.c_str(), &end, 10);
    if (*end != '\0' || cpu < 0) {
      return Status::InvalidArgument(std::string(var) + "='" + raw + "' is not a comma-separated list of CPU numbers");
    }
    out->push_back(static_cast<int>(cpu));
  }
  return Status::OK();
}

}  // namespace

Status Config::FromEnvironment(Config* out) {
  Config c;
  double fusion = static_cast<double>(c.fusion_threshold_bytes);
  double cache = c.cache_capacity;
  double level = c.log_level;
  double shm = c.shm ? 1 : 0;
  double area = static_cast<double>(c.shm_area_bytes);
  for (Status s : {ReadNumber("SCALEOUT_FUSION_THRESHOLD", 0, &fusion),
                   ReadNumber("SCALEOUT_CYCLE_TIME", 0, &c.cycle_time_ms),
                   ReadNumber("SCALEOUT_CACHE_CAPACITY", 0, &cache),
                   ReadNumber("SCALEOUT_STALL_CHECK_TIME_SECONDS", 0, &c.stall_check_seconds),
                   ReadNumber("SCALEOUT_LOG_LEVEL", 0, &level),
                   ReadNumber("SCALEOUT_SHM", 0, &shm),
                   ReadNumber("SCALEOUT_SHM_AREA", 4096, &area)}) {
    if (!s.ok()) return s;
  }
  c.fusion_threshold_bytes = static_cast<size_t>(fusion);
  c.cache_capacity = static_cast<int>(cache);
  c.log_level = static_cast<int>(level);
  c.shm = shm != 0;
  if (area > static_cast<double>(size_t(1) << 40)) {
    return Status::InvalidArgument("SCALEOUT_SHM_AREA='" + std::string(std::getenv("SCALEOUT_SHM_AREA")) +
                                   "' is more than 1 TiB");
  }
  c.shm_area_bytes = static_cast<size_t>(area);
  double servers = 1;
  Status s = ReadNumber("SCALEOUT_EP_SERVERS", 0, &servers);
  if (!s.ok()) return s;
  c.ep_servers = servers < 1 ? 1 : static_cast<int>(servers);
  if (const char* timeline = std::getenv("SCALEOUT_TIMELINE")) c.timeline_path = timeline;
  s = ReadCpuList("SCALEOUT_EP_CORES", &c.ep_cores);
  if (!s.ok()) return s;
  *out = c;
  return Status::OK();
}

std::string Config::ToString() const {
  std::ostringstream s;
  s << "SCALEOUT_FUSION_THRESHOLD=" << fusion_threshold_bytes << "\n"
    << "SCALEOUT_CYCLE_TIME=" << cycle_time_ms << "\n"
    << "SCALEOUT_CACHE_CAPACITY=" << cache_capacity << "\n"
    << "SCALEOUT_STALL_CHECK_TIME_SECONDS=" << stall_check_seconds << "\n"
    << "SCALEOUT_LOG_LEVEL=" << log_level << "\n"
    << "SCALEOUT_TIMELINE=" << timeline_path << "\n"
    << "SCALEOUT_SHM=" << (shm ? 1 : 0) << "\n"
    << "SCALEOUT_SHM_AREA=" << shm_area_bytes << "\n"
    << "SCALEOUT_EP_SERVERS=" << ep_servers << "\n"
    << "SCALEOUT_EP_CORES=";
  for (size_t i = 0; i < ep_cores.size(); ++i) s << (i ? "," : "") << ep_cores[i];
  s << "\n";
  return s.str();
}

}  // namespace scaleout
