#include "runtime/runtime.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "common/hash.h"
#include "common/logging.h"
#include "common/traffic.h"
#include "runtime/result_memory.h"

namespace scaleout {

Status Runtime::Create(bool has_comm, int64_t comm_c_handle, int64_t epoch,
                       std::shared_ptr<Runtime>* out) {
  std::shared_ptr<Runtime> rt(new Runtime());
  rt->handles_.SetEpoch(epoch);
  traffic::Reset();  // Note [Traffic]: counts since init
  Status s = Config::FromEnvironment(&rt->config_);
  if (!s.ok()) return s;
  // Settings that change how ranks take part in collectives must be the same on every rank.
  auto global = std::make_shared<ProcessSet>();
  so_mpi_handle user = 0;
  s = MpiContext::StartMpi(has_comm, comm_c_handle, &user);
  if (!s.ok()) return s;
  s = MpiContext::Create(user, rt->config_.ep_servers,
                         {{"SCALEOUT_SHM", rt->config_.shm ? 1 : 0},
                          {"SCALEOUT_SHM_AREA", static_cast<int64_t>(rt->config_.shm_area_bytes)},
                          {"SCALEOUT_HIERARCHICAL_ALLREDUCE", rt->config_.hierarchical_allreduce},
                          {"SCALEOUT_HIERARCHICAL_ALLGATHER", rt->config_.hierarchical_allgather},
                          // Whether init opens an autotune log: its result is agreed below.
                          {"SCALEOUT_AUTOTUNE (with a log)",
                           rt->config_.autotune && !rt->config_.autotune_log.empty() ? 1 : 0}},
                         &global->mpi);
  if (!s.ok()) return s;
  const Topology& topo = global->mpi->topology();
  global->rank = topo.rank;
  for (int r = 0; r < topo.size; ++r) global->info.ranks.push_back(r);
  rt->global_ = global;
  {
    std::lock_guard<std::mutex> lock(rt->sets_mu_);
    rt->sets_[0] = global;
  }
  SetLogContext(topo.rank, rt->config_.log_level);
  if (topo.rank == 0) {
    for (const std::string& note : rt->config_.notes) SO_LOG(kWarning, note);
  }
  if (rt->config_.autotune) {
    s = rt->OpenAutotuneLog();
    if (!s.ok()) return s;
  }
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  rt->config_.oversubscribed = cpus > 0 && topo.local_size > cpus;
  std::string unpinned;
  rt->coordinator_core_ = rt->config_.CoordinatorCore(topo.local_rank, topo.local_size, &unpinned);
  if (!unpinned.empty()) SO_LOG(kWarning, unpinned);
  s = PeerLiveness::Create(global->mpi->control_comm(), global->mpi->local_comm(),
                           {rt->config_.heartbeat_timeout_seconds, rt->config_.network_interface,
                            rt->config_.stall_check_disable ? 0 : rt->config_.stall_check_seconds},
                           &rt->liveness_);
  if (!s.ok()) return s;
  s = rt->StartProcessSet(global.get());
  if (!s.ok()) return s;
  *out = std::move(rt);
  return Status::OK();
}

// Makes what the plan needs (Note [Algorithm plan]), then settles the plan once shared memory is
// known to be up on every machine, or not.
Status OwnedDataPlane::Create(const MpiContext& mpi, const Config& config, PeerLiveness* liveness,
                              const std::string& who, std::unique_ptr<OwnedDataPlane>* out) {
  auto plane = std::make_unique<OwnedDataPlane>();
  auto transport = [&](so_mpi_handle comm) {
    return std::make_unique<MpiDataTransport>(
        comm, [liveness] { return liveness->Interruption(); }, config.mpi_wait_sleeps);
  };
  for (int i = 0; i < mpi.data_channels(); ++i) {
    plane->transports.push_back(transport(mpi.data_comm(i)));
    plane->view.transports.push_back(plane->transports.back().get());
  }
  const Topology& t = mpi.topology();
  std::vector<std::string> warnings;
  AlgorithmPlan plan = AlgorithmPlan::Decide(
      {t.size, t.machines, t.max_local_size, t.local_size, t.uniform, config.shm,
       config.hierarchical_allreduce, config.hierarchical_allgather},
      &warnings);
  if (t.rank == 0) {
    for (const std::string& warning : warnings) SO_LOG(kWarning, who << warning);
  }
  if (plan.spans_machines()) {
    plane->local = transport(mpi.local_data_comm());
    // The machines' first ranks link the machines (broadcasts, allgathers); with machines of
    // the same size and hierarchical allreduces, every rank's cross communicators link its
    // local rank, one per endpoint server (Note [Hierarchical allreduce]).
    if (plan.allreduce() == SO_ALGORITHM_HIERARCHICAL || t.local_rank == 0) {
      const int channels = plan.hierarchical_allreduce() ? mpi.data_channels() : 1;
      for (int i = 0; i < channels; ++i) plane->cross.push_back(transport(mpi.cross_data_comm(i)));
    }
  }
  if (plan.tries_shared_memory()) {
    DataTransport* bootstrap =
        plan.spans_machines() ? plane->local.get() : plane->transports[0].get();
    // One machine: the coordinators talk through the segment too (Note [Shared-memory control
    // channel]).
    const size_t rings = plan.spans_machines() ? 0 : ShmControlChannel::RingBytes();
    Status s = ShmPeerMemory::Create(bootstrap, config.shm_area_bytes, &plane->peers, rings);
    if (!s.ok()) {
      SO_LOG(kWarning, who << "shared memory unavailable (" << s.message()
                           << "); collectives go through MPI");
    } else {
      plane->peers->SpinFirst(!config.oversubscribed);
    }
    // The machines decided apart (each over its own ranks): all must use the same algorithm.
    int32_t everywhere = plane->peers != nullptr ? 1 : 0;
    s = plane->transports[0]->Allreduce(&everywhere, &everywhere, 1, DataType::kInt32,
                                        ReduceOp::kMin);
    if (!s.ok()) return s;
    if (!everywhere) {
      plane->peers.reset();
      plan = plan.WithoutSharedMemory();
    }
  }
  plane->view.plan = plan;
  plane->view.peers = plane->peers.get();
  if (plan.hierarchical_allreduce()) {
    for (auto& c : plane->cross) plane->view.cross.push_back(c.get());
  }
  if (!plane->cross.empty() && t.local_rank == 0) plane->view.leaders = plane->cross[0].get();
  plane->view.machine_of = t.machine_of;
  plane->view.local_rank_of = t.local_rank_of;
  plane->view.local = plane->local.get();
  if (t.rank == 0) {
    for (const auto& [collective, algorithm] : plan.Describe()) {
      SO_LOG(kInfo, who << collective << ": " << algorithm);
    }
  }
  *out = std::move(plane);
  return Status::OK();
}

Runtime::~Runtime() { Shutdown(); }

void Runtime::Shutdown() {
  {
    // The added sets first, each with its own members (every rank shuts down).
    std::lock_guard<std::mutex> change(change_mu_);
    std::map<int32_t, std::shared_ptr<ProcessSet>> sets;
    {
      std::lock_guard<std::mutex> lock(sets_mu_);
      sets.swap(sets_);
      if (global_) sets_[0] = sets[0];  // the global set stays, as long as the runtime
      sets.erase(0);
    }
    for (auto& kv : sets) StopProcessSet(kv.second.get());
  }
  // The global set's resources stay until the runtime goes: the job's MPI with them.
  if (global_) StopCoordinator(global_.get());
  handles_.FailAll(Status::ShutDown("scaleout was shut down on this rank"));
  result_memory::Trim();  // Note [Result memory]: nothing more to reuse it for
  if (liveness_) {
    liveness_->Stop();
    // Note [Liveness]: with a dead peer, what MPI still holds can never complete.
    if (liveness_->AnyDead() && global_) {
      if (global_->channel) global_->channel->Abandon();
      if (global_->mpi) global_->mpi->Abandon();
    }
  }
}

Status Runtime::SetTimeline(const std::string& path, bool mark_cycles) {
  std::shared_ptr<Coordinator> coordinator;
  {
    std::lock_guard<std::mutex> lock(coordinators_mu_);
    if (global_) coordinator = global_->coordinator;
  }
  if (!coordinator)
    return Status::ShutDown("scaleout is shut down: the timeline cannot be changed");
  return coordinator->SetTimeline(path, mark_cycles);
}

Status Runtime::Validate(const EnqueueArgs& a, int size, TensorEntry* e) const {
  if (a.name == nullptr || a.name[0] == '\0')
    return Status::InvalidArgument("a collective needs a non-empty name");
  const std::string name = a.name;
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument(std::string(CollectiveName(a.collective)) + " '" + name +
                                   "': " + what);
  };
  if (a.collective < 0 || a.collective >= SO_COLLECTIVE_COUNT) {
    return Status::InvalidArgument("'" + name + "': unknown collective " +
                                   std::to_string(a.collective));
  }
  e->is_join = a.collective == SO_JOIN;
  Request& r = e->request;
  r.name = name;
  r.collective = a.collective;
  if (a.collective == SO_JOIN || a.collective == SO_BARRIER) return Status::OK();
  if (!IsValidDataType(a.dtype)) return bad("unsupported dtype code " + std::to_string(a.dtype));
  if (!IsValidReduceOp(a.reduce_op)) return bad("unknown reduce op " + std::to_string(a.reduce_op));
  // Note [Priority]: 0 is the lowest, so no work can be put behind a join (priority 0).
  if (a.priority < 0)
    return bad("priority must be 0 or more (higher goes first), not " + std::to_string(a.priority));
  if (a.ndim < 0 || a.ndim > SO_MAX_NDIM)
    return bad("ndim must be within 0.." + std::to_string(SO_MAX_NDIM));
  if (a.ndim > 0 && a.shape == nullptr)
    return bad("shape is NULL but ndim is " + std::to_string(a.ndim));
  r.dtype = static_cast<DataType>(a.dtype);
  r.reduce_op = static_cast<ReduceOp>(a.reduce_op);
  r.root = a.root;
  r.prescale = a.prescale;
  r.postscale = a.postscale;
  r.priority = a.priority;
  r.shape.assign(a.shape, a.shape + a.ndim);
  for (int64_t d : r.shape) {
    if (d < 0) return bad("negative dimension in shape");
  }
  const bool reduces = a.collective == SO_ALLREDUCE || a.collective == SO_REDUCESCATTER;
  if (!reduces) {
    r.reduce_op = ReduceOp::kSum;
    r.prescale = r.postscale = 1.0;
  } else {
    if (!std::isfinite(a.prescale) || !std::isfinite(a.postscale))
      return bad("scale factors must be finite");
    if (r.dtype == DataType::kBool &&
        (r.reduce_op == ReduceOp::kAverage || a.prescale != 1.0 || a.postscale != 1.0)) {
      return bad(
          "bool tensors support Sum, Min, Max and Product without scale factors, not Average");
    }
    if (r.reduce_op == ReduceOp::kAdasum) {
      if (a.collective != SO_ALLREDUCE) {
        return bad(
            "Adasum is an allreduce op (reducescatter takes Sum, Average, Min, Max, Product)");
      }
      if (!IsFloatingPoint(r.dtype)) {
        return bad(
            std::string("Adasum reduces float16, bfloat16, float32 and float64 tensors, not ") +
            DataTypeName(r.dtype));
      }
      // As Horovod's (a NotImplementedError there too).
      if (a.process_set != 0) {
        return Status::NotSupported("allreduce '" + name +
                                    "': Adasum does not support non-global "
                                    "process sets yet");
      }
      if ((size & (size - 1)) != 0) {
        return Status::NotSupported("allreduce '" + name +
                                    "': running Adasum with non-power of 2 "
                                    "ranks is not supported yet (this job has " +
                                    std::to_string(size) + ")");
      }
    }
  }
  if (a.collective != SO_BROADCAST) r.root = 0;
  if (a.collective == SO_BROADCAST && (a.root < 0 || a.root >= size)) {
    return bad("root rank " + std::to_string(a.root) + " is not in 0.." + std::to_string(size - 1));
  }
  const bool core_owned = a.collective == SO_ALLGATHER || a.collective == SO_ALLTOALL ||
                          a.collective == SO_REDUCESCATTER;
  const size_t bytes = static_cast<size_t>(r.NumElements()) * DataTypeSize(r.dtype);
  if (core_owned && a.output != nullptr)
    return bad("output must be NULL (the core owns the result)");
  if (!core_owned && a.output == nullptr && bytes > 0) return bad("an output buffer is required");
  if (a.input == nullptr && bytes > 0 && a.collective != SO_BROADCAST)
    return bad("input buffer is NULL");
  if ((a.collective == SO_ALLGATHER || a.collective == SO_ALLTOALL ||
       a.collective == SO_REDUCESCATTER) &&
      a.ndim < 1) {
    return bad("needs a tensor with at least one dimension");
  }
  if (a.collective == SO_ALLTOALL) {
    if (a.splits != nullptr) {
      if (a.nsplits != size)
        return bad("splits has " + std::to_string(a.nsplits) + " entries, one per rank (" +
                   std::to_string(size) + ") is needed");
      int64_t sum = 0;
      for (int i = 0; i < a.nsplits; ++i) {
        if (a.splits[i] < 0) return bad("splits must not be negative");
        sum += a.splits[i];
      }
      if (sum != r.shape[0])
        return bad("splits add up to " + std::to_string(sum) + " rows but the tensor has " +
                   std::to_string(r.shape[0]));
      e->splits.assign(a.splits, a.splits + a.nsplits);
    } else if (r.shape[0] % size != 0) {
      return bad("first dimension " + std::to_string(r.shape[0]) +
                 " is not divisible by the number of ranks (" + std::to_string(size) +
                 "); pass splits");
    }
  }
  e->input = a.input;
  e->output = a.output;
  if (a.collective == SO_BROADCAST && a.input == nullptr) e->input = a.output;
  return Status::OK();
}

namespace {

// Note [Caller drives]: the largest collective a caller runs itself (the bytes it moves).
constexpr int64_t kCallerDrivesBytes = 64 << 10;

std::string RankText(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

Status Runtime::Enqueue(const EnqueueArgs& args, int64_t* handle) {
  auto entry = std::make_shared<TensorEntry>();
  entry->process_set = args.process_set;
  // The global set lives as long as the runtime: found without the lock, on the fast path.
  std::shared_ptr<ProcessSet> added;  // another set, kept while the entry is handed over
  ProcessSet* set = global_.get();
  if (args.process_set != 0) {
    added = FindSet(args.process_set);
    if (!added) {
      return Status::InvalidArgument("process set " + std::to_string(args.process_set) +
                                     " does not exist (never added, or removed)");
    }
    set = added.get();
  }
  if (set->rank < 0) {
    return Status::InvalidArgument("rank " + std::to_string(topology().rank) +
                                   " is not in process set " + std::to_string(args.process_set) +
                                   " (ranks " + RankText(set->info.ranks) +
                                   "): only its ranks may run its collectives");
  }
  const int size = static_cast<int>(set->info.ranks.size());
  EnqueueArgs a = args;
  // The global set's ranks are the job's: nothing to translate (a root out of range is
  // Validate's to refuse).
  if (set->info.id != 0 && a.collective == SO_BROADCAST) {
    // As in Horovod, a root is the job's rank; the set's coordinator needs its place in the set.
    const std::vector<int>& ranks = set->info.ranks;
    auto it = std::find(ranks.begin(), ranks.end(), a.root);
    if (it == ranks.end()) {
      return Status::InvalidArgument("broadcast '" + std::string(a.name ? a.name : "") +
                                     "': root rank " + std::to_string(a.root) +
                                     " is not in process set " + std::to_string(a.process_set) +
                                     " (ranks " + RankText(ranks) + ")");
    }
    a.root = static_cast<int>(it - ranks.begin());
  }
  Status s = Validate(a, size, entry.get());
  if (!s.ok()) return s;
  s = handles_.Add(entry);
  if (!s.ok()) return s;
  *handle = entry->handle;
  // Note [Caller drives]: small collectives only (an allgather's result is size times its input).
  const int64_t bytes = entry->request.NumElements() *
                        static_cast<int64_t>(DataTypeSize(entry->request.dtype)) *
                        (a.collective == SO_ALLGATHER ? size : 1);
  entry->caller_waits = a.caller_waits && bytes <= kCallerDrivesBytes;
  const bool wake = !entry->caller_waits;
  set->queue.Push(std::move(entry), wake);
  return Status::OK();
}

Status Runtime::Wait(int64_t handle, double timeout_seconds) {
  std::shared_ptr<TensorEntry> entry = handles_.Find(handle);
  if (entry && entry->caller_waits && !entry->driven.exchange(true)) {
    std::shared_ptr<ProcessSet> set = FindSet(entry->process_set);
    std::shared_ptr<Coordinator> coordinator;
    if (set) {
      std::lock_guard<std::mutex> lock(coordinators_mu_);
      coordinator = set->coordinator;
    }
    if (coordinator) {
      coordinator->Drive(*entry);
    } else if (set) {
      set->queue.Wake();
    }
  }
  return handles_.Wait(handle, timeout_seconds);
}

Status Runtime::AllreduceNow(const EnqueueArgs& args, bool* done) {
  *done = false;
  ProcessSet* set = global_.get();
  if (args.collective != SO_ALLREDUCE || !args.caller_waits || args.process_set != 0 ||
      set->rank < 0)
    return Status::OK();
  // Reused by this thread's calls (what Validate fills keeps its capacity): no allocation.
  thread_local TensorEntry entry;
  const int size = static_cast<int>(set->info.ranks.size());
  if (!Validate(args, size, &entry).ok() ||
      entry.request.NumElements() * static_cast<int64_t>(DataTypeSize(entry.request.dtype)) >
          kCallerDrivesBytes)
    return Status::OK();
  std::shared_ptr<Coordinator> coordinator;
  {
    std::lock_guard<std::mutex> lock(coordinators_mu_);
    coordinator = set->coordinator;
  }
  // The name is reserved as an enqueued collective's is: one of the same name in flight, or a
  // runtime shutting down, is Enqueue's to report.
  if (!coordinator || !handles_.Reserve(0, entry.request.name)) return Status::OK();
  Status s;
  *done = coordinator->LaneNow(&entry, &s);
  handles_.Unreserve(0, entry.request.name);
  return s;
}

namespace {

// MPI_Comm_create_group's tag for a set made by its members (any value: one change at a time
// per process, and creations on disjoint ranks do not meet).
constexpr int kMemberSetTag = 0x5e7;

// Every rank gave the same `values`: checked with one reduction of (-v, v) pairs. *largest, if
// given: the largest of each of `maxima` everywhere, in the same reduction.
Status SameEverywhere(so_mpi_handle comm, std::vector<int64_t> values, bool* same,
                      const std::vector<int64_t>& maxima = {},
                      std::vector<int64_t>* largest = nullptr) {
  std::vector<int64_t> range;
  for (int64_t v : values) range.insert(range.end(), {-v, v});
  range.insert(range.end(), maxima.begin(), maxima.end());
  int rc = Mpi().allreduce(nullptr, range.data(), static_cast<int>(range.size()), SO_MPI_INT64,
                           SO_MPI_MAX, comm);
  if (rc != 0) return MpiError("MPI_Allreduce", rc);
  *same = true;
  for (size_t i = 0; i < values.size(); ++i) *same = *same && -range[2 * i] == range[2 * i + 1];
  if (largest != nullptr) largest->assign(range.begin() + 2 * values.size(), range.end());
  return Status::OK();
}

// A set's ranks: some, each a rank of the job's `size`, in increasing order.
bool ValidSetRanks(const std::vector<int>& ranks, int size) {
  bool valid = !ranks.empty();
  for (size_t i = 0; i < ranks.size(); ++i) {
    valid = valid && ranks[i] >= 0 && ranks[i] < size && (i == 0 || ranks[i] > ranks[i - 1]);
  }
  return valid;
}

// What a call with ranks that ValidSetRanks refuses gets.
Status BadSetRanks(const std::string& what, int size) {
  return Status::InvalidArgument(what +
                                 ": a process set is a non-empty list of distinct ranks of the "
                                 "job, in order, each in 0.." +
                                 std::to_string(size - 1));
}

// This rank's place among `ranks`, or -1.
int PlaceIn(const std::vector<int>& ranks, int rank) {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

}  // namespace

Status Runtime::AddProcessSet(const std::vector<int>& ranks, int32_t* id) {
  std::lock_guard<std::mutex> change(change_mu_);
  const Topology& topo = topology();
  const std::string what = "add_process_set([" + RankText(ranks) + "])";
  const bool valid = ValidSetRanks(ranks, topo.size);
  // The same call on every rank: the ranks' count and a hash of them.
  const uint64_t hash = Fnv1a(ranks);
  bool same = false;
  // Any set with these ranks, the global set included (Horovod 0.28.1 finds the global set's
  // id for a set of every rank and refuses it as existing). A set that its members made exists
  // on them alone: agreed below, so that every rank refuses it.
  int64_t duplicate = -1;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (const auto& kv : sets_) {
      if (kv.second->info.ranks == ranks) duplicate = kv.first;
    }
  }
  // The id: the first that no rank has given out (ranks outside a set its members made did not
  // count it).
  std::vector<int64_t> largest;
  Status s = SameEverywhere(
      mpi().admin_comm(),
      {static_cast<int64_t>(ranks.size()), static_cast<int64_t>(hash >> 1), valid ? 1 : 0}, &same,
      {next_set_id_, duplicate}, &largest);
  if (!s.ok()) return s;
  if (!same) {
    return Status::InvalidArgument(what +
                                   ": every rank must add the same process set, in the same "
                                   "order, and the ranks differ between ranks");
  }
  if (!valid) return BadSetRanks(what, topo.size);
  if (largest[1] >= 0) {
    return Status::InvalidArgument(what + ": process set " + std::to_string(largest[1]) +
                                   " has these ranks already")
        .WithProcessSet(static_cast<int32_t>(largest[1]));
  }
  next_set_id_ = static_cast<int32_t>(largest[0]);
  auto set = std::make_shared<ProcessSet>();
  set->info.id = next_set_id_;
  set->info.ranks = ranks;
  set->rank = PlaceIn(ranks, topo.rank);
  so_mpi_handle comm = 0;
  int rc = Mpi().comm_split(mpi().admin_comm(), set->rank >= 0 ? 0 : -1, topo.rank, &comm);
  if (rc != 0) return MpiError("MPI_Comm_split", rc);
  Status made;
  if (set->rank >= 0) {
    made = MpiContext::Create(comm, config_.ep_servers, {}, &set->mpi);
    Mpi().comm_free(&comm);
    if (made.ok()) made = StartProcessSet(set.get());
  }
  // Every rank learns whether it worked everywhere (members only could fail).
  int32_t ok = made.ok() ? 1 : 0;
  rc = Mpi().allreduce(nullptr, &ok, 1, SO_MPI_INT32, SO_MPI_MIN, mpi().admin_comm());
  if (rc != 0) return MpiError("MPI_Allreduce", rc);
  if (!ok) {
    StopProcessSet(set.get());
    return made.ok() ? Status::Transport(what + ": another rank could not make the process set")
                     : made.Reworded(what + ": " + made.message());
  }
  *id = next_set_id_++;
  std::lock_guard<std::mutex> lock(sets_mu_);
  sets_[*id] = std::move(set);
  return Status::OK();
}

Status Runtime::AddMemberProcessSet(const std::vector<int>& ranks, int32_t* id) {
  std::lock_guard<std::mutex> change(change_mu_);
  const Topology& topo = topology();
  const std::string what = "a process set of ranks [" + RankText(ranks) + "] made by its members";
  if (!ValidSetRanks(ranks, topo.size)) return BadSetRanks(what, topo.size);
  auto set = std::make_shared<ProcessSet>();
  set->info.ranks = ranks;
  set->rank = PlaceIn(ranks, topo.rank);
  if (set->rank < 0) {
    return Status::InvalidArgument(what + ": rank " + std::to_string(topo.rank) +
                                   " is not one of them; only its members make it");
  }
  {
    // A set with these ranks is one every member has (added by every rank, or made by these
    // members): theirs.
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (const auto& kv : sets_) {
      if (kv.second->info.ranks == ranks) {
        *id = kv.first;
        return Status::OK();
      }
    }
  }
  so_mpi_handle comm = 0;
  int rc = Mpi().comm_create_group(mpi().admin_comm(), ranks.data(), static_cast<int>(ranks.size()),
                                   kMemberSetTag, &comm);
  if (rc != 0) return MpiError("MPI_Comm_create_group", rc);
  // The members agree on the ranks and take an id none of them has given out.
  const uint64_t hash = Fnv1a(ranks);
  bool same = false;
  std::vector<int64_t> first_free;
  Status made =
      SameEverywhere(comm, {static_cast<int64_t>(hash >> 1)}, &same, {next_set_id_}, &first_free);
  if (made.ok() && !same) {
    made = Status::InvalidArgument(what + ": its members gave different ranks");
  }
  if (made.ok()) {
    set->info.id = static_cast<int32_t>(first_free[0]);
    made = MpiContext::Create(comm, config_.ep_servers, {}, &set->mpi);
  }
  if (made.ok()) made = StartProcessSet(set.get());
  // Every member learns whether it worked on all of them.
  int32_t ok = made.ok() ? 1 : 0;
  rc = Mpi().allreduce(nullptr, &ok, 1, SO_MPI_INT32, SO_MPI_MIN, comm);
  Mpi().comm_free(&comm);
  if (rc != 0) made = MpiError("MPI_Allreduce", rc);
  if (!made.ok() || !ok) {
    StopProcessSet(set.get());
    return made.ok() ? Status::Transport(what + ": another member could not make it")
                     : made.Reworded(what + ": " + made.message());
  }
  *id = set->info.id;
  next_set_id_ = *id + 1;
  std::lock_guard<std::mutex> lock(sets_mu_);
  sets_[*id] = std::move(set);
  return Status::OK();
}

Status Runtime::OpenAutotuneLog() {
  const std::string& path = config_.autotune_log;
  if (path.empty()) return Status::OK();
  int32_t error = 0;
  if (topology().rank == 0) {
    errno = 0;
    auto file = std::make_unique<std::ofstream>(path, std::ios::out | std::ios::trunc);
    if (file->good()) {
      autotune_log_ = std::move(file);
    } else {
      error = errno != 0 ? errno : EIO;
    }
  }
  // Every rank learns rank 0's result, so a log that cannot be written fails init on every
  // rank, not on rank 0 alone with the others waiting for it.
  std::vector<int32_t> all(static_cast<size_t>(topology().size));
  int rc = Mpi().allgather(&error, 1, SO_MPI_INT32, all.data(), mpi().admin_comm());
  if (rc != 0) return MpiError("MPI_Allgather", rc);
  if (all[0] != 0) {
    return Status::InvalidArgument(config_.sources["SCALEOUT_AUTOTUNE_LOG"] + "='" + path +
                                   "' cannot be written on rank 0: " + std::strerror(all[0]));
  }
  return Status::OK();
}

Status Runtime::StartProcessSet(ProcessSet* set) {
  const Topology& t = set->mpi->topology();
  PeerLiveness* liveness = liveness_.get();
  const int32_t id = set->info.id;
  Status s = OwnedDataPlane::Create(*set->mpi, config_, liveness,
                                    id == 0 ? "" : "process set " + std::to_string(id) + ": ",
                                    &set->plane);
  if (!s.ok()) return s;
  if (id == 0) {
    // What config() reports: the job's paths in use.
    config_.shm = set->plane->view.peers != nullptr;
    config_.algorithms = set->plane->view.plan.Describe();
  }
  auto mpi_channel = std::make_unique<MpiControlChannel>(set->mpi->control_comm());
  ShmPeerMemory* peers = set->plane->peers.get();
  if (peers != nullptr && peers->ControlRing(1, true) != nullptr) {
    set->channel = std::make_unique<ShmControlChannel>(
        mpi_channel->rank(), mpi_channel->size(),
        [peers](int peer, bool toward_zero) { return peers->ControlRing(peer, toward_zero); },
        std::move(mpi_channel));
  } else {
    set->channel = std::move(mpi_channel);
  }
  auto coordinator = std::make_shared<Coordinator>(config_, set->channel.get(), set->plane->view,
                                                   &handles_, &set->queue, liveness, set->info);
  if (id == 0 && config_.autotune && t.rank == 0) {
    AutotuneOptions tune;
    tune.warmup_samples = config_.autotune_warmup_samples;
    tune.steps_per_sample = config_.autotune_steps_per_sample;
    tune.max_samples = config_.autotune_max_samples;
    tune.noise = config_.autotune_noise;
    tune.fusion_threshold_bytes = config_.fusion_threshold_bytes;
    tune.cycle_time_ms = config_.cycle_time_ms;
    tune.fusion_fixed = config_.sources["SCALEOUT_FUSION_THRESHOLD"] != "default";
    tune.cycle_fixed = config_.sources["SCALEOUT_CYCLE_TIME"] != "default";
    const AlgorithmPlan& plan = set->plane->view.plan;
    tune.hierarchical_allreduce = plan.hierarchical_allreduce();
    tune.hierarchical_allgather = plan.allgather() == SO_ALGORITHM_HIERARCHICAL;
    tune.cache_enabled = config_.cache_capacity > 0;
    coordinator->EnableAutotune(tune, std::move(autotune_log_));
  }
  coordinator->Start(t.rank, coordinator_core_);
  std::lock_guard<std::mutex> lock(coordinators_mu_);
  set->coordinator = std::move(coordinator);
  return Status::OK();
}

void Runtime::StopCoordinator(ProcessSet* set) {
  std::shared_ptr<Coordinator> coordinator;
  {
    std::lock_guard<std::mutex> lock(coordinators_mu_);
    coordinator.swap(set->coordinator);
  }
  if (coordinator) coordinator->Stop();
}

void Runtime::StopProcessSet(ProcessSet* set) {
  StopCoordinator(set);
  handles_.CloseSet(
      set->info.id,
      Status::InvalidArgument("process set " + std::to_string(set->info.id) + " was removed"));
  if (liveness_ && liveness_->AnyDead()) {
    if (set->channel) set->channel->Abandon();
    if (set->mpi) set->mpi->Abandon();
  }
  set->channel.reset();
  set->plane.reset();
  set->mpi.reset();
}

Status Runtime::RemoveProcessSet(int32_t id) {
  std::lock_guard<std::mutex> change(change_mu_);
  std::shared_ptr<ProcessSet> set = FindSet(id);
  const std::string what = "remove_process_set(" + std::to_string(id) + ")";
  // Agreed first: the same id everywhere, and nothing of the set in flight on any rank.
  const int size = topology().size;
  int32_t mine[2] = {set ? 1 : 0, set ? handles_.Unfinished(id) : 0};
  std::vector<int32_t> all(2 * static_cast<size_t>(size));
  int rc = Mpi().allgather(mine, 2, SO_MPI_INT32, all.data(), mpi().admin_comm());
  if (rc != 0) return MpiError("MPI_Allgather", rc);
  bool same = false;
  Status s = SameEverywhere(mpi().admin_comm(), {id}, &same);
  if (!s.ok()) return s;
  std::vector<int> unknown, busy;
  for (int r = 0; r < size; ++r) {
    if (!all[2 * r]) unknown.push_back(r);
    if (all[2 * r + 1] > 0) busy.push_back(r);
  }
  if (!same) return Status::InvalidArgument(what + ": every rank must remove the same process set");
  if (id == 0) return Status::InvalidArgument(what + ": the global process set cannot be removed");
  if (!unknown.empty()) {
    return Status::InvalidArgument(what + ": no such process set (never added, or removed)");
  }
  if (!busy.empty()) {
    return Status::InvalidArgument(what + ": process set " + std::to_string(id) +
                                   " still has collectives in flight on rank(s) " + RankText(busy) +
                                   "; wait for them before removing it");
  }
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    sets_.erase(id);
  }
  StopProcessSet(set.get());
  return Status::OK();
}

Status Runtime::DescribeProcessSet(int32_t id, std::vector<int>* ranks, int* rank) const {
  std::shared_ptr<ProcessSet> set = FindSet(id);
  if (!set) {
    return Status::InvalidArgument("process set " + std::to_string(id) +
                                   " does not exist (never added, or removed)");
  }
  *ranks = set->info.ranks;
  *rank = set->rank;
  return Status::OK();
}

std::shared_ptr<ProcessSet> Runtime::FindSet(int32_t id) const {
  if (id == 0) return global_;  // lives as long as the runtime
  std::lock_guard<std::mutex> lock(sets_mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

}  // namespace scaleout
