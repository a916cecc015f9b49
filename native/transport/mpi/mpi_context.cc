#include "transport/mpi/mpi_context.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <string>

namespace scaleout {
namespace {

const char* ThreadLevelName(int level) {
  static constexpr const char* kNames[] = {"MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED",
                                           "MPI_THREAD_SERIALIZED", "MPI_THREAD_MULTIPLE"};
  return kNames[level < 0 || level > 3 ? 3 : level];
}

std::atomic<bool> g_finalize_abandoned{false};  // MpiContext::Abandon: for the process's exit

void FinalizeAtExit() {
  if (g_finalize_abandoned.load()) return;
  int finalized = 0;
  Mpi().finalized(&finalized);
  if (!finalized) Mpi().finalize();
}

}  // namespace

Status MpiContext::StartMpi(bool has_comm, int64_t comm_c_handle, so_mpi_handle* user) {
  if (!MpiLoaded()) {
    return Status::NotInitialized(
        "no MPI shim is loaded (scaleout._native loads the one for the MPI mpi4py uses)");
  }
  const so_mpi_api& mpi = Mpi();
  int initialized = 0, finalized = 0;
  mpi.initialized(&initialized);
  mpi.finalized(&finalized);
  if (finalized) {
    return Status::NotInitialized(
        "MPI has already been finalized in this process; scaleout "
        "cannot start after MPI_Finalize");
  }
  if (!initialized) {
    int rc = mpi.init_thread_multiple();
    if (rc != 0) return MpiError("MPI_Init_thread", rc);
    std::atexit(FinalizeAtExit);
  }
  int level = 0;
  mpi.query_thread(&level);
  if (level != 3) {
    return Status::InvalidArgument(
        std::string("MPI was initialised with ") + ThreadLevelName(level) +
        ", but scaleout's coordinator thread needs MPI_THREAD_MULTIPLE (with mpi4py, leave "
        "mpi4py.rc.thread_level at its default 'multiple' before importing mpi4py.MPI)");
  }
  *user = mpi.comm_world();
  if (has_comm) {
    int rc = mpi.comm_from_c(comm_c_handle, user);
    if (rc != 0) return MpiError("taking init's communicator", rc);
  }
  if (*user == 0) return Status::InvalidArgument("init(comm=...) got MPI_COMM_NULL");
  return Status::OK();
}

Status MpiContext::Create(so_mpi_handle user, int data_channels,
                          const std::vector<std::pair<std::string, int64_t>>& agreed,
                          std::unique_ptr<MpiContext>* out) {
  const so_mpi_api& mpi = Mpi();
  std::unique_ptr<MpiContext> ctx(new MpiContext());
  int rc = mpi.comm_dup(user, &ctx->control_);
  if (rc != 0) return MpiError("MPI_Comm_dup", rc);
  // Before the data communicators, whose number is one of the settings: a mismatch there would
  // hang in MPI_Comm_dup. One reduction of (-value, value) pairs gives every setting's min and max.
  std::vector<std::pair<std::string, int64_t>> settings = {{"SCALEOUT_EP_SERVERS", data_channels}};
  settings.insert(settings.end(), agreed.begin(), agreed.end());
  std::vector<int64_t> range;
  for (const auto& setting : settings) range.insert(range.end(), {-setting.second, setting.second});
  rc = mpi.allreduce(nullptr, range.data(), static_cast<int>(range.size()), SO_MPI_INT64,
                     SO_MPI_MAX, ctx->control_);
  if (rc != 0) return MpiError("MPI_Allreduce", rc);
  for (size_t i = 0; i < settings.size(); ++i) {
    if (-range[2 * i] == range[2 * i + 1]) continue;
    // Every rank sees the same range, so all come here together to learn who has what.
    int size = 0;
    mpi.comm_size(ctx->control_, &size);
    std::vector<int64_t> values(size);
    rc = mpi.allgather(&settings[i].second, 1, SO_MPI_INT64, values.data(), ctx->control_);
    if (rc != 0) return MpiError("MPI_Allgather", rc);
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
  rc = mpi.comm_dup(user, &ctx->admin_);
  if (rc != 0) return MpiError("MPI_Comm_dup", rc);
  ctx->data_.assign(data_channels, 0);
  for (so_mpi_handle& c : ctx->data_) {
    rc = mpi.comm_dup(user, &c);
    if (rc != 0) return MpiError("MPI_Comm_dup", rc);
  }
  Topology& t = ctx->topo_;
  mpi.comm_rank(ctx->control_, &t.rank);
  mpi.comm_size(ctx->control_, &t.size);
  rc = mpi.comm_split_shared(ctx->control_, t.rank, &ctx->local_);
  if (rc != 0) return MpiError("MPI_Comm_split_type", rc);
  mpi.comm_rank(ctx->local_, &t.local_rank);
  mpi.comm_size(ctx->local_, &t.local_size);
  rc = mpi.comm_split(ctx->control_, t.local_rank, t.rank, &ctx->cross_);
  if (rc != 0) return MpiError("MPI_Comm_split", rc);
  mpi.comm_rank(ctx->cross_, &t.cross_rank);
  mpi.comm_size(ctx->cross_, &t.cross_size);
  // The layout every rank must agree on: machines (the first local ranks' cross size) and the
  // smallest and largest machine.
  int layout[3] = {-t.local_size, t.local_size, t.cross_size};
  rc = mpi.allreduce(nullptr, layout, 3, SO_MPI_INT, SO_MPI_MAX, ctx->control_);
  if (rc != 0) return MpiError("MPI_Allreduce", rc);
  t.uniform = -layout[0] == layout[1];
  t.max_local_size = layout[1];
  t.machines = layout[2];
  int where[2] = {t.cross_rank, t.local_rank};  // the machine: its first rank's cross rank
  rc = mpi.bcast(&where[0], 1, SO_MPI_INT, 0, ctx->local_);
  if (rc != 0) return MpiError("MPI_Bcast", rc);
  std::vector<int> everyone(2 * static_cast<size_t>(t.size));
  rc = mpi.allgather(where, 2, SO_MPI_INT, everyone.data(), ctx->control_);
  if (rc != 0) return MpiError("MPI_Allgather", rc);
  for (int q = 0; q < t.size; ++q) {
    t.machine_of.push_back(everyone[2 * q]);
    t.local_rank_of.push_back(everyone[2 * q + 1]);
  }
  // Only collectives across machines use them (OwnedDataPlane::Create): none on one machine.
  if (t.machines > 1) ctx->cross_data_.assign(data_channels, 0);
  std::vector<std::pair<so_mpi_handle, so_mpi_handle*>> dups;
  if (t.machines > 1) dups.emplace_back(ctx->local_, &ctx->local_data_);
  for (so_mpi_handle& c : ctx->cross_data_) dups.emplace_back(ctx->cross_, &c);
  for (auto [from, to] : dups) {
    rc = mpi.comm_dup(from, to);
    if (rc != 0) return MpiError("MPI_Comm_dup", rc);
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
  const so_mpi_api& mpi = Mpi();
  int finalized = 0;
  mpi.finalized(&finalized);
  if (finalized) return;
  for (so_mpi_handle* c : {&control_, &local_, &cross_, &admin_, &local_data_}) {
    if (*c != 0) mpi.comm_free(c);
  }
  for (std::vector<so_mpi_handle>* comms : {&data_, &cross_data_}) {
    for (so_mpi_handle& c : *comms) {
      if (c != 0) mpi.comm_free(&c);
    }
  }
}

}  // namespace scaleout
