// The C ABI: every entry point catches everything and returns a status code; the message of the
// last failure on the calling thread is kept for so_last_error().
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "c_api/scaleout.h"
#include "common/dtype.h"
#include "common/traffic.h"
#include "runtime/runtime.h"
#include "transport/mpi/mpi_api.h"

#define SO_EXPORT extern "C" __attribute__((visibility("default")))

#ifndef SCALEOUT_BUILD_INFO
#define SCALEOUT_BUILD_INFO "an unnamed compiler"
#endif

namespace {

using scaleout::Runtime;
using scaleout::Status;

thread_local Status t_last_error;  // its message and details (Note [Error details])

// The current runtime; callers take a reference so a concurrent shutdown cannot free it under them.
std::mutex g_mu;
std::shared_ptr<Runtime> g_runtime;
int64_t g_last_epoch = 0;  // epochs of runtimes started so far (guarded by g_mu)

std::shared_ptr<Runtime> Current() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_runtime;
}

// A handle from a runtime that has been shut down since (its epoch is older than the current
// runtime's, or there is none now).
bool FromStoppedRuntime(int64_t handle, const Runtime* rt) {
  const int64_t epoch = handle >> SO_HANDLE_EPOCH_SHIFT;
  std::lock_guard<std::mutex> lock(g_mu);
  return epoch >= 1 && epoch <= g_last_epoch && (rt == nullptr || epoch < rt->epoch());
}

int Fail(const Status& s) {
  t_last_error = s;
  return s.code();
}

int Report(const Status& s) { return s.ok() ? SO_OK : Fail(s); }

Status NotInitialized() {
  return Status::NotInitialized(
      "scaleout is not initialized: call init() first (and not after shutdown())");
}

template <typename Fn>
int Guard(Fn&& fn) {
  try {
    return fn();
  } catch (const scaleout::InternalError& e) {
    return Fail(Status::Internal(e.message));
  } catch (const std::bad_alloc&) {
    return Fail(Status::Internal("out of memory"));
  } catch (const std::exception& e) {
    return Fail(Status::Internal(e.what()));
  } catch (...) {
    return Fail(Status::Internal("unknown C++ exception"));
  }
}

// Runs fn(runtime) when initialised.
template <typename Fn>
int WithRuntime(Fn&& fn) {
  return Guard([&]() -> int {
    std::shared_ptr<Runtime> rt = Current();
    if (!rt) return Fail(NotInitialized());
    return fn(*rt);
  });
}

// Runs fn(runtime) for a handle of the current runtime; a handle of a runtime shut down since
// gets SO_ERR_SHUT_DOWN.
template <typename Fn>
int WithHandle(int64_t handle, Fn&& fn) {
  return Guard([&]() -> int {
    std::shared_ptr<Runtime> rt = Current();
    if (FromStoppedRuntime(handle, rt.get())) {
      return Fail(
          Status::ShutDown("scaleout was shut down while this collective was pending; "
                           "its result is lost"));
    }
    if (!rt) return Fail(NotInitialized());
    return fn(*rt);
  });
}

// Runs fn(entry) for a completed, successful handle.
template <typename Fn>
int WithResult(int64_t handle, Fn&& fn) {
  return WithHandle(handle, [&](Runtime& rt) -> int {
    std::shared_ptr<scaleout::TensorEntry> e;
    Status s = rt.handles().Get(handle, &e);
    if (!s.ok()) return Fail(s);
    return fn(*e);
  });
}

}  // namespace

SO_EXPORT int so_abi_version(void) { return SCALEOUT_ABI_VERSION; }
SO_EXPORT const char* so_version(void) { return "0.1.0"; }
SO_EXPORT const char* so_build_info(void) { return SCALEOUT_BUILD_INFO; }
SO_EXPORT const char* so_status_name(int code) { return scaleout::StatusName(code); }
SO_EXPORT const char* so_last_error(void) { return t_last_error.message().c_str(); }

SO_EXPORT int so_last_error_details(int32_t* culprits_out, int capacity, int32_t* count_out,
                                    int32_t* process_set_out) {
  const std::vector<int32_t>& culprits = t_last_error.culprit_ranks();
  *count_out = static_cast<int32_t>(culprits.size());
  for (int i = 0; culprits_out != nullptr && i < capacity && i < *count_out; ++i) {
    culprits_out[i] = culprits[i];
  }
  *process_set_out = t_last_error.process_set_id();
  return SO_OK;
}

SO_EXPORT int so_use_mpi(const so_mpi_api* api) {
  return Guard([&]() -> int {
    Status s = scaleout::UseMpi(api);
    return s.ok() ? SO_OK : Fail(s);
  });
}

SO_EXPORT int so_init(int has_comm, int64_t comm_c_handle) {
  return Guard([&]() -> int {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_runtime) return SO_OK;
    std::shared_ptr<Runtime> rt;
    Status s = Runtime::Create(has_comm != 0, comm_c_handle, g_last_epoch + 1, &rt);
    if (!s.ok()) return Fail(s);
    ++g_last_epoch;
    g_runtime = std::move(rt);
    return SO_OK;
  });
}

SO_EXPORT int so_shutdown(void) {
  return Guard([&]() -> int {
    std::shared_ptr<Runtime> rt;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      rt.swap(g_runtime);
    }
    if (rt) rt->Shutdown();
    return SO_OK;
  });
}

SO_EXPORT int so_is_initialized(void) { return Current() ? 1 : 0; }

SO_EXPORT int so_topology(int32_t* out) {
  return WithRuntime([&](Runtime& rt) -> int {
    const scaleout::Topology& t = rt.topology();
    int32_t values[6] = {t.rank, t.size, t.local_rank, t.local_size, t.cross_rank, t.cross_size};
    std::memcpy(out, values, sizeof(values));
    return SO_OK;
  });
}

SO_EXPORT const char* so_config_string(void) {
  thread_local std::string text;
  std::shared_ptr<Runtime> rt = Current();
  text = rt ? rt->config().ToString() : "";
  return text.c_str();
}

SO_EXPORT int so_stats(int64_t* out) {
  return WithRuntime([&](Runtime& rt) -> int {
    rt.handles().Counts(&out[0], &out[1]);
    return SO_OK;
  });
}

SO_EXPORT int so_traffic(int64_t* out) {
  return WithRuntime([&](Runtime&) -> int {
    scaleout::traffic::Read(out);
    return SO_OK;
  });
}

SO_EXPORT int so_algorithms(int32_t* out) {
  return WithRuntime([&](Runtime& rt) -> int {
    for (int entry = 0; entry < SO_PLAN_COUNT; ++entry) out[entry] = rt.plan().of(entry);
    return SO_OK;
  });
}

SO_EXPORT int so_peer_died(void) { return scaleout::PeerLiveness::LostAPeer() ? 1 : 0; }

SO_EXPORT int so_add_process_set(const int32_t* ranks, int nranks, int32_t* id_out) {
  return WithRuntime([&](Runtime& rt) -> int {
    if (nranks < 0 || (nranks > 0 && ranks == nullptr)) {
      return Fail(Status::InvalidArgument("add_process_set: no ranks given"));
    }
    return Report(rt.AddProcessSet(std::vector<int>(ranks, ranks + nranks), id_out));
  });
}

SO_EXPORT int so_add_member_process_set(const int32_t* ranks, int nranks, int32_t* id_out) {
  return WithRuntime([&](Runtime& rt) -> int {
    if (nranks < 0 || (nranks > 0 && ranks == nullptr)) {
      return Fail(Status::InvalidArgument("add_member_process_set: no ranks given"));
    }
    return Report(rt.AddMemberProcessSet(std::vector<int>(ranks, ranks + nranks), id_out));
  });
}

SO_EXPORT int so_remove_process_set(int32_t id) {
  return WithRuntime([&](Runtime& rt) -> int { return Report(rt.RemoveProcessSet(id)); });
}

SO_EXPORT int so_process_set(int32_t id, int32_t* rank_out, int32_t* size_out, int32_t* ranks_out,
                             int capacity) {
  return WithRuntime([&](Runtime& rt) -> int {
    std::vector<int> ranks;
    int rank = -1;
    Status s = rt.DescribeProcessSet(id, &ranks, &rank);
    if (!s.ok()) return Fail(s);
    *rank_out = rank;
    *size_out = static_cast<int32_t>(ranks.size());
    for (int i = 0; ranks_out != nullptr && i < capacity && i < static_cast<int>(ranks.size());
         ++i) {
      ranks_out[i] = ranks[i];
    }
    return SO_OK;
  });
}

SO_EXPORT int so_timeline(const char* path, int mark_cycles) {
  return WithRuntime([&](Runtime& rt) -> int {
    Status s =
        rt.SetTimeline(path == nullptr ? std::string() : std::string(path), mark_cycles != 0);
    return s.ok() ? SO_OK : Fail(s);
  });
}

namespace {

// The one place a request record becomes EnqueueArgs (Note [Request record]).
Status ToEnqueueArgs(const so_request* r, scaleout::EnqueueArgs* a) {
  constexpr size_t kFirstVersionSize = offsetof(so_request, process_set) + sizeof(int32_t);
  if (r == nullptr || r->struct_size < kFirstVersionSize) {
    return Status::InvalidArgument(
        "so_enqueue: the request record is missing or older than the "
        "first version (struct_size " +
        std::to_string(r == nullptr ? 0u : r->struct_size) + ")");
  }
  a->name = r->name;
  a->collective = r->collective;
  a->dtype = r->dtype;
  a->ndim = r->ndim;
  a->shape = r->shape;
  a->input = r->input;
  a->output = r->output;
  a->reduce_op = r->reduce_op;
  a->root = r->root_rank;
  a->prescale = r->prescale_factor;
  a->postscale = r->postscale_factor;
  a->splits = r->splits;
  a->nsplits = r->nsplits;
  a->process_set = r->process_set;
  if (r->struct_size >= offsetof(so_request, caller_waits) + sizeof(int32_t))
    a->caller_waits = r->caller_waits != 0;
  if (r->struct_size >= offsetof(so_request, priority) + sizeof(int32_t)) a->priority = r->priority;
  return Status::OK();
}

}  // namespace

SO_EXPORT int so_enqueue(const so_request* request, int64_t* handle_out) {
  return WithRuntime([&](Runtime& rt) -> int {
    scaleout::EnqueueArgs a;
    Status s = ToEnqueueArgs(request, &a);
    if (!s.ok()) return Fail(s);
    return Report(rt.Enqueue(a, handle_out));
  });
}

SO_EXPORT int so_allreduce_now(const so_request* request, int* done_out) {
  *done_out = 0;
  return WithRuntime([&](Runtime& rt) -> int {
    scaleout::EnqueueArgs a;
    if (!ToEnqueueArgs(request, &a).ok()) return SO_OK;  // so_enqueue explains it
    bool done = false;
    Status s = rt.AllreduceNow(a, &done);
    *done_out = done ? 1 : 0;
    return Report(s);
  });
}

SO_EXPORT int so_poll(int64_t handle, int* done_out) {
  return WithHandle(handle, [&](Runtime& rt) -> int {
    bool done = false;
    Status s = rt.handles().Poll(handle, &done);
    *done_out = done ? 1 : 0;
    return Report(s);
  });
}

SO_EXPORT int so_wait(int64_t handle, double timeout_seconds) {
  return WithHandle(handle,
                    [&](Runtime& rt) -> int { return Report(rt.Wait(handle, timeout_seconds)); });
}

SO_EXPORT int so_result_shape(int64_t handle, int* ndim_out, int64_t* shape_out) {
  return WithResult(handle, [&](const scaleout::TensorEntry& e) -> int {
    *ndim_out = static_cast<int>(e.result_shape.size());
    for (size_t i = 0; i < e.result_shape.size(); ++i) shape_out[i] = e.result_shape[i];
    return SO_OK;
  });
}

SO_EXPORT int so_result_take(int64_t handle, void** data_out, int64_t* nbytes_out,
                             void** buffer_out) {
  return WithResult(handle, [&](scaleout::TensorEntry& e) -> int {
    auto* held = new scaleout::ResultBytes(std::move(e.result));
    e.result.clear();
    *data_out = held->data();
    *nbytes_out = static_cast<int64_t>(held->size());
    *buffer_out = held;
    return SO_OK;
  });
}

SO_EXPORT void so_buffer_free(void* buffer) { delete static_cast<scaleout::ResultBytes*>(buffer); }

SO_EXPORT int so_result_splits(int64_t handle, int64_t* splits_out, int capacity,
                               int32_t* count_out) {
  return WithResult(handle, [&](const scaleout::TensorEntry& e) -> int {
    const int count = static_cast<int>(e.received_splits.size());
    if (capacity < count) {
      return Fail(Status::InvalidArgument("the handle has " + std::to_string(count) +
                                          " received splits, more than " +
                                          std::to_string(capacity)));
    }
    for (int i = 0; i < count; ++i) splits_out[i] = e.received_splits[i];
    *count_out = count;
    return SO_OK;
  });
}

SO_EXPORT int so_result_join_rank(int64_t handle, int32_t* rank_out) {
  return WithResult(handle, [&](const scaleout::TensorEntry& e) -> int {
    *rank_out = e.join_rank;
    return SO_OK;
  });
}

SO_EXPORT int so_release(int64_t handle) {
  return WithHandle(handle,
                    [&](Runtime& rt) -> int { return Report(rt.handles().Release(handle)); });
}
