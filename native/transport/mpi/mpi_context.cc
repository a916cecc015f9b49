#include "transport/mpi/mpi_context.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <string>

namespace scaleout {
namespace {

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    default:
      return "MPI_THREAD_MULTIPLE";
  }
}

std::atomic<bool> g_finalize_abandoned{false};  // MpiContext::Abandon: for the process's exit

void FinalizeAtExit() {
  if (g_finalize_abandoned.load()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

Status MpiError(const char* what, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return Status::Transport(std::string(what) + " failed: " + std::string(text, len));
}

Status MpiContext::Create(bool has_comm, int64_t comm_fortran_handle, int data_channels,
                          const std::vector<std::pair<std::string, int64_t>>& agreed,
                          std::unique_ptr<MpiContext>* out) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    return Status::NotInitialized(
        "MPI has already been finalized in this process; scaleout "
        "cannot start after MPI_Finalize");
  }
  if (!initialized) {
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Init_thread", rc);
    std::atexit(FinalizeAtExit);
  }
  int level = 0;
  MPI_Query_thread(&level);
  if (level != MPI_THREAD_MULTIPLE) {
    return Status::InvalidArgument(
        std::string("MPI was initialised with ") + ThreadLevelName(level) +
        ", but scaleout's coordinator thread needs MPI_THREAD_MULTIPLE (with mpi4py, leave "
        "mpi4py.rc.thread_level at its default 'multiple' before importing mpi4py.MPI)");
  }
  MPI_Comm user =
      !has_comm ? MPI_COMM_WORLD : MPI_Comm_f2c(static_cast<MPI_Fint>(comm_fortran_handle));
  if (user == MPI_COMM_NULL) return Status::InvalidArgument("init(comm=...) got MPI_COMM_NULL");
  std::unique_ptr<MpiContext> ctx(new MpiContext());
  int rc = MPI_Comm_dup(user, &ctx->control_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Comm_dup", rc);
  MPI_Comm_set_errhandler(ctx->control_, MPI_ERRORS_RETURN);
  // Before the data communicators, whose number is one of the settings: a mismatch there would
  // hang in MPI_Comm_dup. One reduction of (-value, value) pairs gives every setting's min and max.
  std::vector<std::pair<std::string, int64_t>> settings = {{"SCALEOUT_EP_SERVERS", data_channels}};
  settings.insert(settings.end(), agreed.begin(), agreed.end());
  std::vector<int64_t> range;
  for (const auto& setting : settings) range.insert(range.end(), {-setting.second, setting.second});
  rc = MPI_Allreduce(MPI_IN_PLACE, range.data(), static_cast<int>(range.size()), MPI_INT64_T,
                     MPI_MAX, ctx->control_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Allreduce", rc);
  for (size_t i = 0; i < settings.size(); ++i) {
    if (-range[2 * i] == range[2 * i + 1]) continue;
    // Every rank sees the same range, so all come here together to learn who has what.
    int size = 0;
    MPI_Comm_size(ctx->control_, &size);
    std::vector<int64_t> values(size);
    rc = MPI_Allgather(&settings[i].second, 1, MPI_INT64_T, values.data(), 1, MPI_INT64_T,
                       ctx->control_);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Allgather", rc);
    std::map<int64_t, std::vector<int>> ranks_of;
    for (int r = 0; r < size; ++r) ranks_of[values[r]].push_back(r);
    std::string who;
    for (const auto& [value, ranks] : ranks_of) {
      // -1 is how the auto/1/0 settings say auto (the others are never negative).
      who += (who.empty() ? "" : "; ") +
             (value == -1 ? std::string("auto") : std::to_string(value)) + " on rank" +
             (ranks.size() > 1 ? "s " : " ");
      for (size_t k = 0; k < ranks.size(); ++k) who += (k ? ", " : "") + std::to_string(ranks[k]);
    }
    return Status::InvalidArgument(settings[i].first + " differs across ranks (" + who +
                                   "); every rank must use the same value");
  }
  rc = MPI_Comm_dup(user, &ctx->admin_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Comm_dup", rc);
  MPI_Comm_set_errhandler(ctx->admin_, MPI_ERRORS_RETURN);
  ctx->data_.assign(data_channels, MPI_COMM_NULL);
  for (MPI_Comm& c : ctx->data_) {
    rc = MPI_Comm_dup(user, &c);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Comm_dup", rc);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  }
  Topology& t = ctx->topo_;
  MPI_Comm_rank(ctx->control_, &t.rank);
  MPI_Comm_size(ctx->control_, &t.size);
  rc =
      MPI_Comm_split_type(ctx->control_, MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &ctx->local_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Comm_split_type", rc);
  MPI_Comm_rank(ctx->local_, &t.local_rank);
  MPI_Comm_size(ctx->local_, &t.local_size);
  rc = MPI_Comm_split(ctx->control_, t.local_rank, t.rank, &ctx->cross_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Comm_split", rc);
  MPI_Comm_rank(ctx->cross_, &t.cross_rank);
  MPI_Comm_size(ctx->cross_, &t.cross_size);
  // The layout every rank must agree on: machines (the first local ranks' cross size) and the
  // smallest and largest machine.
  int layout[3] = {-t.local_size, t.local_size, t.cross_size};
  rc = MPI_Allreduce(MPI_IN_PLACE, layout, 3, MPI_INT, MPI_MAX, ctx->control_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Allreduce", rc);
  t.uniform = -layout[0] == layout[1];
  t.max_local_size = layout[1];
  t.machines = layout[2];
  int where[2] = {t.cross_rank, t.local_rank};  // the machine: its first rank's cross rank
  rc = MPI_Bcast(&where[0], 1, MPI_INT, 0, ctx->local_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Bcast", rc);
  std::vector<int> everyone(2 * static_cast<size_t>(t.size));
  rc = MPI_Allgather(where, 2, MPI_INT, everyone.data(), 2, MPI_INT, ctx->control_);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Allgather", rc);
  for (int q = 0; q < t.size; ++q) {
    t.machine_of.push_back(everyone[2 * q]);
    t.local_rank_of.push_back(everyone[2 * q + 1]);
  }
  // Only collectives across machines use them (OwnedDataPlane::Create): none on one machine.
  if (t.machines > 1) ctx->cross_data_.assign(data_channels, MPI_COMM_NULL);
  std::vector<std::pair<MPI_Comm, MPI_Comm*>> dups;
  if (t.machines > 1) dups.emplace_back(ctx->local_, &ctx->local_data_);
  for (MPI_Comm& c : ctx->cross_data_) dups.emplace_back(ctx->cross_, &c);
  for (auto [from, to] : dups) {
    rc = MPI_Comm_dup(from, to);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Comm_dup", rc);
    MPI_Comm_set_errhandler(*to, MPI_ERRORS_RETURN);
  }
  *out = std::move(ctx);
  return Status::OK();
}

void MpiContext::Abandon() {
  abandoned_ = true;
  g_finalize_abandoned.store(true);
}

MpiContext::~MpiContext() {
  if (abandoned_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&control_, &local_, &cross_, &admin_, &local_data_}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
  for (std::vector<MPI_Comm>* comms : {&data_, &cross_data_}) {
    for (MPI_Comm& c : *comms) {
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    }
  }
}

}  // namespace scaleout
