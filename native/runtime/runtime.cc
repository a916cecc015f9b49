#include "runtime/runtime.h"

#include <cmath>
#include <sstream>

#include "common/logging.h"

namespace scaleout {

Status Runtime::Create(bool has_comm, int64_t comm_fortran_handle, int64_t epoch,
                       std::shared_ptr<Runtime>* out) {
  std::shared_ptr<Runtime> rt(new Runtime());
  rt->handles_.SetEpoch(epoch);
  Status s = Config::FromEnvironment(&rt->config_);
  if (!s.ok()) return s;
  // Settings that change how ranks take part in collectives must be the same on every rank.
  s = MpiContext::Create(has_comm, comm_fortran_handle, rt->config_.ep_servers,
                         {{"SCALEOUT_SHM", rt->config_.shm ? 1 : 0},
                          {"SCALEOUT_SHM_AREA", static_cast<int64_t>(rt->config_.shm_area_bytes)}},
                         &rt->mpi_);
  if (!s.ok()) return s;
  const Topology& topo = rt->mpi_->topology();
  SetLogContext(topo.rank, rt->config_.log_level);
  if (topo.rank == 0) {
    for (const std::string& note : rt->config_.notes) SO_LOG(kWarning, note);
  }
  std::string unpinned;
  const int core = rt->config_.CoordinatorCore(topo.local_rank, topo.local_size, &unpinned);
  if (!unpinned.empty()) SO_LOG(kWarning, unpinned);
  s = PeerLiveness::Create(rt->mpi_->control_comm(), rt->mpi_->local_comm(),
                           {rt->config_.heartbeat_timeout_seconds, rt->config_.network_interface,
                            rt->config_.stall_check_disable ? 0 : rt->config_.stall_check_seconds},
                           &rt->liveness_);
  if (!s.ok()) return s;
  PeerLiveness* liveness = rt->liveness_.get();
  rt->channel_ = std::make_unique<MpiControlChannel>(rt->mpi_->control_comm());
  std::vector<DataTransport*> transports;
  for (int i = 0; i < rt->mpi_->data_channels(); ++i) {
    rt->transports_.push_back(std::make_unique<MpiDataTransport>(
        rt->mpi_->data_comm(i), [liveness] { return liveness->Interruption(); },
        rt->config_.mpi_wait_sleeps));
    transports.push_back(rt->transports_.back().get());
  }
  // Note [Staged allreduce]: ranks that all share this machine reduce through shared memory.
  if (topo.size > 1 && topo.local_size == topo.size && rt->config_.shm) {
    s = ShmPeerMemory::Create(transports[0], rt->config_.shm_area_bytes, &rt->peers_);
    if (!s.ok()) {
      SO_LOG(kWarning, "shared memory unavailable (" << s.message() << "); allreduces go through MPI");
    }
  }
  rt->config_.shm = rt->peers_ != nullptr;  // what config() reports: the path in use
  rt->coordinator_ = std::make_shared<Coordinator>(rt->config_, rt->channel_.get(), transports,
                                                   rt->peers_.get(), &rt->handles_, &rt->queue_,
                                                   liveness);
  rt->coordinator_->Start(topo.rank, core);
  *out = std::move(rt);
  return Status::OK();
}

Runtime::~Runtime() { Shutdown(); }

void Runtime::Shutdown() {
  std::shared_ptr<Coordinator> coordinator;
  {
    std::lock_guard<std::mutex> lock(coordinator_mu_);
    coordinator.swap(coordinator_);
  }
  if (coordinator) coordinator->Stop();
  handles_.FailAll(Status::ShutDown("scaleout was shut down on this rank"));
  if (liveness_) {
    liveness_->Stop();
    // Note [Liveness]: with a dead peer, what MPI still holds can never complete.
    if (liveness_->AnyDead()) {
      if (channel_) channel_->Abandon();
      if (mpi_) mpi_->Abandon();
    }
  }
}

Status Runtime::SetTimeline(const std::string& path, bool mark_cycles) {
  std::shared_ptr<Coordinator> coordinator;
  {
    std::lock_guard<std::mutex> lock(coordinator_mu_);
    coordinator = coordinator_;
  }
  if (!coordinator) return Status::ShutDown("scaleout is shut down: the timeline cannot be changed");
  return coordinator->SetTimeline(path, mark_cycles);
}

Status Runtime::Validate(const EnqueueArgs& a, TensorEntry* e) const {
  const int size = topology().size;
  if (a.name == nullptr || a.name[0] == '\0') return Status::InvalidArgument("a collective needs a non-empty name");
  const std::string name = a.name;
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument(std::string(CollectiveName(a.collective)) + " '" + name + "': " + what);
  };
  if (a.collective < 0 || a.collective >= SO_COLLECTIVE_COUNT) {
    return Status::InvalidArgument("'" + name + "': unknown collective " + std::to_string(a.collective));
  }
  e->is_join = a.collective == SO_JOIN;
  Request& r = e->request;
  r.name = name;
  r.collective = a.collective;
  if (a.collective == SO_JOIN || a.collective == SO_BARRIER) return Status::OK();
  if (!IsValidDataType(a.dtype)) return bad("unsupported dtype code " + std::to_string(a.dtype));
  if (!IsValidReduceOp(a.reduce_op)) return bad("unknown reduce op " + std::to_string(a.reduce_op));
  if (a.ndim < 0 || a.ndim > SO_MAX_NDIM) return bad("ndim must be within 0.." + std::to_string(SO_MAX_NDIM));
  if (a.ndim > 0 && a.shape == nullptr) return bad("shape is NULL but ndim is " + std::to_string(a.ndim));
  r.dtype = static_cast<DataType>(a.dtype);
  r.reduce_op = static_cast<ReduceOp>(a.reduce_op);
  r.root = a.root;
  r.prescale = a.prescale;
  r.postscale = a.postscale;
  r.shape.assign(a.shape, a.shape + a.ndim);
  for (int64_t d : r.shape) {
    if (d < 0) return bad("negative dimension in shape");
  }
  const bool reduces = a.collective == SO_ALLREDUCE || a.collective == SO_REDUCESCATTER;
  if (!reduces) {
    r.reduce_op = ReduceOp::kSum;
    r.prescale = r.postscale = 1.0;
  } else {
    if (!std::isfinite(a.prescale) || !std::isfinite(a.postscale)) return bad("scale factors must be finite");
    if (r.dtype == DataType::kBool && (r.reduce_op == ReduceOp::kAverage || a.prescale != 1.0 || a.postscale != 1.0)) {
      return bad("bool tensors support Sum, Min, Max and Product without scale factors, not Average");
    }
  }
  if (a.collective != SO_BROADCAST) r.root = 0;
  if (a.collective == SO_BROADCAST && (a.root < 0 || a.root >= size)) {
    return bad("root rank " + std::to_string(a.root) + " is not in 0.." + std::to_string(size - 1));
  }
  const bool core_owned = a.collective == SO_ALLGATHER || a.collective == SO_ALLTOALL || a.collective == SO_REDUCESCATTER;
  const size_t bytes = static_cast<size_t>(r.NumElements()) * DataTypeSize(r.dtype);
  if (core_owned && a.output != nullptr) return bad("output must be NULL (the core owns the result)");
  if (!core_owned && a.output == nullptr && bytes > 0) return bad("an output buffer is required");
  if (a.input == nullptr && bytes > 0 && a.collective != SO_BROADCAST) return bad("input buffer is NULL");
  if ((a.collective == SO_ALLGATHER || a.collective == SO_ALLTOALL || a.collective == SO_REDUCESCATTER) && a.ndim < 1) {
    return bad("needs a tensor with at least one dimension");
  }
  if (a.collective == SO_ALLTOALL) {
    if (a.splits != nullptr) {
      if (a.nsplits != size) return bad("splits has " + std::to_string(a.nsplits) + " entries, one per rank (" + std::to_string(size) + ") is needed");
      int64_t sum = 0;
      for (int i = 0; i < a.nsplits; ++i) {
        if (a.splits[i] < 0) return bad("splits must not be negative");
        sum += a.splits[i];
      }
      if (sum != r.shape[0]) return bad("splits add up to " + std::to_string(sum) + " rows but the tensor has " + std::to_string(r.shape[0]));
      e->splits.assign(a.splits, a.splits + a.nsplits);
    } else if (r.shape[0] % size != 0) {
      return bad("first dimension " + std::to_string(r.shape[0]) + " is not divisible by the number of ranks (" +
                 std::to_string(size) + "); pass splits");
    }
  }
  e->input = a.input;
  e->output = a.output;
  if (a.collective == SO_BROADCAST && a.input == nullptr) e->input = a.output;
  return Status::OK();
}

Status Runtime::Enqueue(const EnqueueArgs& args, int64_t* handle) {
  auto entry = std::make_shared<TensorEntry>();
  Status s = Validate(args, entry.get());
  if (!s.ok()) return s;
  s = handles_.Add(entry);
  if (!s.ok()) return s;
  *handle = entry->handle;
  queue_.Push(std::move(entry));
  return Status::OK();
}

}  // namespace scaleout
