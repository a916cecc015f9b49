#include "common/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

extern char** environ;

namespace scaleout {
namespace {

// Every setting's suffix, and whether Horovod 0.28.1 has it too (read from SCALEOUT_<suffix>,
// else HOROVOD_<suffix>): Note [Settings table].
struct Setting {
  const char* suffix;
  bool twin;
};
const Setting kSettings[] = {
#define SO_SETTING_(SUFFIX, twin, default_text, description) {#SUFFIX, twin != 0},
    SO_SETTINGS_TABLE(SO_SETTING_)
#undef SO_SETTING_
};

const Setting* FindSetting(const std::string& suffix) {
  for (const Setting& s : kSettings) {
    if (suffix == s.suffix) return &s;
  }
  return nullptr;
}

// Horovod 0.28.1's run-time variables that scaleout does not implement, and what they control
// (from horovod/common/common.h, logging.cc, gloo/gloo_context.cc and the docs).
struct Unimplemented {
  const char* name;
  const char* what;
};
const Unimplemented kUnimplemented[] = {
    {"HOROVOD_CONTROLLER", "a choice of controller (scaleout always negotiates over MPI)"},
    {"HOROVOD_CPU_OPERATIONS",
     "a choice of CPU backend (scaleout uses MPI, and shared memory "
     "within one machine)"},
    {"HOROVOD_MPI_THREADS_DISABLE", "running without MPI_THREAD_MULTIPLE"},
    {"HOROVOD_GLOO_IFACE", "Gloo"},
    {"HOROVOD_GLOO_RENDEZVOUS_ADDR", "Gloo rendezvous"},
    {"HOROVOD_GLOO_RENDEZVOUS_PORT", "Gloo rendezvous"},
    {"HOROVOD_GLOO_TIMEOUT_SECONDS", "Gloo rendezvous"},
    {"HOROVOD_CCL_CACHE", "oneCCL"},
    {"HOROVOD_NUM_NCCL_STREAMS", "NCCL (GPU)"},
    {"HOROVOD_BATCH_D2D_MEMCOPIES", "GPU memory copies"},
    {"HOROVOD_DISABLE_NVTX_RANGES", "NVTX ranges (GPU)"},
    {"HOROVOD_ENABLE_ASYNC_COMPLETION", "asynchronous GPU completion"},
    {"HOROVOD_ENABLE_XLA_OPS", "XLA ops"},
    {"HOROVOD_ADASUM_MPI_CHUNK_SIZE", "Adasum"},
    {"HOROVOD_DISABLE_GROUP_FUSION", "switching off the fusion of grouped collectives"},
    {"HOROVOD_LOG_HIDE_TIME", "log timestamps (scaleout's log lines carry none)"},
};

// Variables horovodrun sets for the program to read, as scaleoutrun does (Note [horovodrun's
// rank variables] in launcher/rank_env.py): the core reads none of them, and says nothing.
const char* const kLauncherSet[] = {
    "HOROVOD_HOSTNAME",   "HOROVOD_RANK",       "HOROVOD_SIZE",       "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_ELASTIC",
};

// Variables of Horovod's build (setup.py), not of a running job.
const char* const kBuildPrefixes[] = {
    "HOROVOD_WITH_", "HOROVOD_WITHOUT_",
    "HOROVOD_NCCL_", "HOROVOD_CUDA_",
    "HOROVOD_ROCM_", "HOROVOD_BUILD_",
    "HOROVOD_CMAKE", "HOROVOD_MPICXX_SHOW",
    "HOROVOD_DEBUG", "HOROVOD_ALLOW_MIXED_GPU_IMPL",
};

bool StartsWith(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

// The line for a HOROVOD_* variable that has no effect; empty for one scaleout honours.
std::string NoteFor(const std::string& name) {
  for (const Setting& s : kSettings) {
    if (s.twin && name == std::string("HOROVOD_") + s.suffix) return "";
  }
  for (const char* set : kLauncherSet) {
    if (name == set) return "";
  }
  for (const Unimplemented& u : kUnimplemented) {
    if (name == u.name) {
      return name + " is set but has no effect: scaleout does not implement " + u.what;
    }
  }
  if (StartsWith(name, "HOROVOD_GPU")) {
    return name + " is set but has no effect: scaleout does not run collectives on GPUs";
  }
  for (const char* prefix : kBuildPrefixes) {
    if (StartsWith(name, prefix)) {
      return name + " is set but has no effect: it configures Horovod's build, not scaleout";
    }
  }
  return name + " is set but has no effect: it is not a Horovod 0.28.1 variable scaleout knows";
}

// Reads settings through a lookup, recording where each value came from.
class Reader {
 public:
  Reader(const std::function<const char*(const char*)>& getenv, Config* c)
      : getenv_(getenv), c_(c) {}

  // The raw value of SCALEOUT_<suffix> (or, for a twin, HOROVOD_<suffix>); nullptr if neither
  // is set. *var is the variable it came from.
  const char* Raw(const std::string& suffix, std::string* var) {
    const Setting* setting = FindSetting(suffix);
    SO_CHECK(setting != nullptr, "SCALEOUT_" + suffix + " has no row in SO_SETTINGS_TABLE");
    const std::string mine = "SCALEOUT_" + suffix;
    c_->sources[mine] = "default";
    *var = mine;
    const char* value = Nonempty(getenv_(mine.c_str()));
    if (!setting->twin) {
      if (value != nullptr) c_->sources[mine] = mine;
      return value;
    }
    const std::string theirs = "HOROVOD_" + suffix;
    const char* horovod = Nonempty(getenv_(theirs.c_str()));
    if (value != nullptr) {
      c_->sources[mine] = mine;
      if (horovod != nullptr && std::strcmp(horovod, value) != 0) {
        c_->notes.push_back(theirs + "=" + horovod + " has no effect: " + mine + "=" + value +
                            " is set too and takes precedence");
      }
      return value;
    }
    if (horovod != nullptr) {
      c_->sources[mine] = theirs;
      *var = theirs;
    }
    return horovod;
  }

  // A number >= min_value; absent leaves *out unchanged.
  Status Number(const std::string& suffix, double min_value, double* out,
                double max_value = HUGE_VAL) {
    std::string var;
    const char* raw = Raw(suffix, &var);
    if (raw == nullptr) return Status::OK();
    char* end = nullptr;
    errno = 0;
    double value = std::strtod(raw, &end);
    if (errno != 0 || end == raw || *end != '\0' || !(value >= min_value && value <= max_value)) {
      std::ostringstream msg;
      msg << var << "='" << raw << "' is not a number ";
      if (max_value < HUGE_VAL) {
        msg << "from " << min_value << " to " << max_value;
      } else {
        msg << ">= " << min_value;
      }
      return Status::InvalidArgument(msg.str());
    }
    *out = value;
    return Status::OK();
  }

  // A whole number from min_value to max_value; absent leaves *out unchanged.
  Status Count(const std::string& suffix, int min_value, int max_value, int* out) {
    std::string var;
    const char* raw = Raw(suffix, &var);
    if (raw == nullptr) return Status::OK();
    char* end = nullptr;
    errno = 0;
    long value = std::strtol(raw, &end, 10);
    if (errno != 0 || end == raw || *end != '\0' || value < min_value || value > max_value) {
      return Status::InvalidArgument(var + "='" + raw + "' is not a whole number from " +
                                     std::to_string(min_value) + " to " +
                                     std::to_string(max_value));
    }
    *out = static_cast<int>(value);
    return Status::OK();
  }

  Status Flag(const std::string& suffix, bool* out) {
    double v = *out ? 1 : 0;
    Status s = Number(suffix, 0, &v);
    *out = v != 0;
    return s;
  }

  // "auto" -> -1, "1"/"0" -> 1/0; absent leaves *out unchanged.
  Status AutoFlag(const std::string& suffix, int* out) {
    std::string var;
    const char* raw = Raw(suffix, &var);
    if (raw == nullptr) return Status::OK();
    const std::string v = raw;
    if (v == "auto") {
      *out = -1;
    } else if (v == "1" || v == "0") {
      *out = v == "1" ? 1 : 0;
    } else {
      return Status::InvalidArgument(var + "='" + v + "' is not auto, 1 or 0");
    }
    return Status::OK();
  }

  // "3,7,11" -> {3, 7, 11}; absent leaves *out empty.
  Status CpuList(const std::string& suffix, std::vector<int>* out) {
    std::string var;
    const char* raw = Raw(suffix, &var);
    if (raw == nullptr) return Status::OK();
    std::stringstream in(raw);
    std::string item;
    while (std::getline(in, item, ',')) {
      if (item.empty()) continue;
      char* end = nullptr;
      long cpu = std::strtol(item.c_str(), &end, 10);
      if (end == item.c_str() || *end != '\0' || cpu < 0) {
        return Status::InvalidArgument(var + "='" + raw +
                                       "' is not a comma-separated list of CPU numbers");
      }
      out->push_back(static_cast<int>(cpu));
    }
    return Status::OK();
  }

  Status LogLevel(int* out) {
    std::string var;
    const char* raw = Raw("LOG_LEVEL", &var);
    if (raw == nullptr) return Status::OK();
    if (!ParseLogLevel(raw, out)) {
      return Status::InvalidArgument(var + "='" + raw +
                                     "' is not a log level: use 0-3 or one of "
                                     "trace, debug, info, warning, error, fatal");
    }
    return Status::OK();
  }

  std::string Text(const std::string& suffix, const std::string& fallback) {
    std::string var;
    const char* raw = Raw(suffix, &var);
    return raw != nullptr ? raw : fallback;
  }

 private:
  static const char* Nonempty(const char* v) { return v != nullptr && *v != '\0' ? v : nullptr; }

  const std::function<const char*(const char*)>& getenv_;
  Config* c_;
};

// Note [Autotune]: what init says about the autotune settings (rank 0 logs it).
void AutotuneNotes(Config* c) {
  auto source = [c](const char* setting) { return c->sources[setting]; };
  if (!c->autotune) {
    for (const char* s :
         {"SCALEOUT_AUTOTUNE_LOG", "SCALEOUT_AUTOTUNE_WARMUP_SAMPLES",
          "SCALEOUT_AUTOTUNE_STEPS_PER_SAMPLE", "SCALEOUT_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
          "SCALEOUT_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"}) {
      if (source(s) != "default") {
        c->notes.push_back(source(s) + " is set but has no effect: autotuning is off (set " +
                           "HOROVOD_AUTOTUNE=1 or SCALEOUT_AUTOTUNE=1)");
      }
    }
    return;
  }
  const bool fusion = source("SCALEOUT_FUSION_THRESHOLD") != "default";
  const bool cycle = source("SCALEOUT_CYCLE_TIME") != "default";
  if (fusion && cycle) {
    c->notes.push_back("autotune has nothing to tune: " + source("SCALEOUT_FUSION_THRESHOLD") +
                       " and " + source("SCALEOUT_CYCLE_TIME") +
                       " are both set, and a setting given wins over tuning (as in Horovod)");
  } else if (fusion || cycle) {
    std::ostringstream s;
    s << "autotune leaves "
      << (fusion ? source("SCALEOUT_FUSION_THRESHOLD") : source("SCALEOUT_CYCLE_TIME"))
      << " as set (";
    if (fusion) {
      s << c->fusion_threshold_bytes << " bytes";
    } else {
      s << c->cycle_time_ms << " ms";
    }
    s << ": a setting given wins over tuning, as in Horovod) and tunes only the "
      << (fusion ? "cycle time" : "fusion threshold");
    c->notes.push_back(s.str());
  }
}

}  // namespace

bool ParseLogLevel(const std::string& text, int* level) {
  std::string lower = text;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  // Horovod's six levels onto scaleout's four: it has no trace or fatal-only logging.
  static const std::pair<const char*, int> kNames[] = {{"trace", 3},   {"debug", 3}, {"info", 2},
                                                       {"warning", 1}, {"warn", 1},  {"error", 0},
                                                       {"fatal", 0}};
  for (const auto& n : kNames) {
    if (lower == n.first) {
      *level = n.second;
      return true;
    }
  }
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0' || v < 0) return false;
  *level = static_cast<int>(std::min<long>(v, 3));
  return true;
}

Status Config::Parse(const std::function<const char*(const char*)>& getenv,
                     const std::vector<std::string>& horovod_names, Config* out) {
  Config c;
  Reader read(getenv, &c);
  double fusion = static_cast<double>(c.fusion_threshold_bytes);
  double cache = c.cache_capacity;
  double area = static_cast<double>(c.shm_area_bytes);
  double priority_bytes = static_cast<double>(c.priority_bytes);
  double servers = 1;
  for (Status s :
       {read.Number("FUSION_THRESHOLD", 0, &fusion),
        read.Number("CYCLE_TIME", 0, &c.cycle_time_ms),
        read.Number("PRIORITY_BYTES", 0, &priority_bytes),
        read.Flag("AUTOTUNE", &c.autotune),
        read.Count("AUTOTUNE_WARMUP_SAMPLES", 0, 1000000, &c.autotune_warmup_samples),
        read.Count("AUTOTUNE_STEPS_PER_SAMPLE", 1, 1000000, &c.autotune_steps_per_sample),
        read.Count("AUTOTUNE_BAYES_OPT_MAX_SAMPLES", 1, kAutotuneMaxSamples,
                   &c.autotune_max_samples),
        read.Number("AUTOTUNE_GAUSSIAN_PROCESS_NOISE", 0, &c.autotune_noise, 1e6),
        read.Number("CACHE_CAPACITY", 0, &cache),
        read.Flag("FAST_LANE", &c.fast_lane),
        read.Number("STALL_CHECK_TIME_SECONDS", 0, &c.stall_check_seconds),
        read.Flag("STALL_CHECK_DISABLE", &c.stall_check_disable),
        read.Number("STALL_SHUTDOWN_TIME_SECONDS", 0, &c.stall_shutdown_seconds),
        read.Number("DEADLOCK_CHECK_SECONDS", 0, &c.deadlock_check_seconds),
        read.Number("HEARTBEAT_TIMEOUT_SECONDS", 0, &c.heartbeat_timeout_seconds),
        read.Flag("DYNAMIC_PROCESS_SETS", &c.dynamic_process_sets),
        read.LogLevel(&c.log_level),
        read.Flag("TIMELINE_MARK_CYCLES", &c.timeline_mark_cycles),
        read.Flag("SHM", &c.shm),
        read.AutoFlag("HIERARCHICAL_ALLREDUCE", &c.hierarchical_allreduce),
        read.AutoFlag("HIERARCHICAL_ALLGATHER", &c.hierarchical_allgather),
        read.Number("SHM_AREA", 4096, &area),
        read.Number("EP_SERVERS", 0, &servers),
        read.CpuList("EP_CORES", &c.ep_cores),
        read.CpuList("THREAD_AFFINITY", &c.thread_affinity)}) {
    if (!s.ok()) return s;
  }
  c.timeline_path = read.Text("TIMELINE", "");
  c.autotune_log = read.Text("AUTOTUNE_LOG", "");
  c.network_interface = read.Text("NETWORK_INTERFACE", "");
  for (const char* mpi_variable :
       {"MPIR_CVAR_ENABLE_HEAVY_YIELD", "OMPI_MCA_mpi_yield_when_idle"}) {
    const char* v = getenv(mpi_variable);
    if (v != nullptr && std::strcmp(v, "1") == 0) c.mpi_wait_sleeps = true;
  }
  c.fusion_threshold_bytes = static_cast<size_t>(fusion);
  c.cache_capacity = static_cast<int>(cache);
  c.priority_bytes = static_cast<size_t>(priority_bytes);
  if (area > static_cast<double>(size_t(1) << 40)) {
    return Status::InvalidArgument(
        "SCALEOUT_SHM_AREA='" + std::string(getenv("SCALEOUT_SHM_AREA")) + "' is more than 1 TiB");
  }
  c.shm_area_bytes = static_cast<size_t>(area);
  c.ep_servers = servers < 1 ? 1 : static_cast<int>(servers);
  AutotuneNotes(&c);
  if (!c.stall_check_disable && c.stall_check_seconds > 0 && c.stall_shutdown_seconds > 0 &&
      c.stall_shutdown_seconds < c.stall_check_seconds) {
    std::ostringstream s;
    s << "the stall shutdown time (" << c.stall_shutdown_seconds << " s, "
      << c.sources["SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS"]
      << ") is less than the stall check time (" << c.stall_check_seconds
      << " s): as in Horovod, stalled collectives only warn";
    c.notes.push_back(s.str());
  }
  std::vector<std::string> names = horovod_names;
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    std::string note = NoteFor(name);
    if (!note.empty()) c.notes.push_back(note);
  }
  *out = std::move(c);
  return Status::OK();
}

Status Config::FromEnvironment(Config* out) {
  std::vector<std::string> horovod_names;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    if (StartsWith(name, "HOROVOD_")) horovod_names.push_back(name);
  }
  return Parse([](const char* var) -> const char* { return std::getenv(var); }, horovod_names, out);
}

int Config::CoordinatorCore(int local_rank, int local_size, std::string* why) const {
  if (thread_affinity.empty()) return -1;
  const std::string& var = sources.count("SCALEOUT_THREAD_AFFINITY")
                               ? sources.at("SCALEOUT_THREAD_AFFINITY")
                               : std::string("SCALEOUT_THREAD_AFFINITY");
  if (static_cast<int>(thread_affinity.size()) < local_size) {
    *why = var + " lists " + std::to_string(thread_affinity.size()) +
           " CPUs but this machine runs " + std::to_string(local_size) +
           " ranks (one CPU per local rank is needed); the coordinator "
           "thread is not pinned";
    return -1;
  }
  return thread_affinity[local_rank];
}

std::string Config::ToString() const {
  std::ostringstream s;
  auto cpus = [](const std::vector<int>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
    return out;
  };
  auto line = [&](const char* key, const auto& value) {
    s << key << "=" << value << "\n";
    auto it = sources.find(key);
    s << key << ".source=" << (it == sources.end() ? "default" : it->second) << "\n";
  };
  line("SCALEOUT_FUSION_THRESHOLD", fusion_threshold_bytes);
  line("SCALEOUT_CYCLE_TIME", cycle_time_ms);
  line("SCALEOUT_PRIORITY_BYTES", priority_bytes);
  line("SCALEOUT_AUTOTUNE", autotune ? 1 : 0);
  line("SCALEOUT_AUTOTUNE_LOG", autotune_log);
  line("SCALEOUT_AUTOTUNE_WARMUP_SAMPLES", autotune_warmup_samples);
  line("SCALEOUT_AUTOTUNE_STEPS_PER_SAMPLE", autotune_steps_per_sample);
  line("SCALEOUT_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", autotune_max_samples);
  line("SCALEOUT_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", autotune_noise);
  line("SCALEOUT_CACHE_CAPACITY", cache_capacity);
  line("SCALEOUT_FAST_LANE", fast_lane ? 1 : 0);
  line("SCALEOUT_STALL_CHECK_TIME_SECONDS", stall_check_seconds);
  line("SCALEOUT_STALL_CHECK_DISABLE", stall_check_disable ? 1 : 0);
  line("SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS", stall_shutdown_seconds);
  line("SCALEOUT_DEADLOCK_CHECK_SECONDS", deadlock_check_seconds);
  line("SCALEOUT_HEARTBEAT_TIMEOUT_SECONDS", heartbeat_timeout_seconds);
  line("SCALEOUT_DYNAMIC_PROCESS_SETS", dynamic_process_sets ? 1 : 0);
  line("SCALEOUT_NETWORK_INTERFACE", network_interface);
  line("SCALEOUT_LOG_LEVEL", log_level);
  line("SCALEOUT_TIMELINE", timeline_path);
  line("SCALEOUT_TIMELINE_MARK_CYCLES", timeline_mark_cycles ? 1 : 0);
  line("SCALEOUT_SHM", shm ? 1 : 0);
  line("SCALEOUT_SHM_AREA", shm_area_bytes);
  auto automatic = [](int v) { return v < 0 ? std::string("auto") : std::to_string(v); };
  line("SCALEOUT_HIERARCHICAL_ALLREDUCE", automatic(hierarchical_allreduce));
  line("SCALEOUT_HIERARCHICAL_ALLGATHER", automatic(hierarchical_allgather));
  for (const auto& [collective, algorithm] : algorithms) {
    s << collective << "_algorithm=" << algorithm << "\n";
  }
  line("SCALEOUT_EP_SERVERS", ep_servers);
  line("SCALEOUT_EP_CORES", cpus(ep_cores));
  line("SCALEOUT_THREAD_AFFINITY", cpus(thread_affinity));
  return s.str();
}

}  // namespace scaleout
