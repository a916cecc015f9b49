#include "transport/mpi/mpi_api.h"

#include <atomic>
#include <string>

#include "collectives/reduce_kernels.h"

namespace scaleout {
namespace {

std::atomic<const so_mpi_api*> g_api{nullptr};

// float16 and bfloat16 have no MPI type: they travel as 16-bit words and are combined by user
// ops that add (or min, max, multiply) two of them in float32 and round once (ReduceInto), so
// each pairwise combine MPI's algorithm makes rounds once (Note [Halves on the wire]).
void CombineHalves(void* inout, const void* in, int count, int half, int op) {
  static constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                                      ReduceOp::kProduct};
  ReduceInto(inout, in, static_cast<size_t>(count),
             half == SO_MPI_FLOAT16 ? DataType::kFloat16 : DataType::kBFloat16, kOps[op]);
}

}  // namespace

Status UseMpi(const so_mpi_api* api) {
  if (api == nullptr) return Status::InvalidArgument("so_use_mpi: no MPI shim table");
  if (api->version != SO_MPI_API_VERSION || api->struct_size != sizeof(so_mpi_api)) {
    return Status::InvalidArgument("the MPI shim's table is version " +
                                   std::to_string(api->version) + ", the core's " +
                                   std::to_string(SO_MPI_API_VERSION) + ": reinstall scaleout");
  }
  const so_mpi_api* expected = nullptr;
  if (!g_api.compare_exchange_strong(expected, api) && expected != api) {
    return Status::InvalidArgument(std::string("this process already uses the ") + expected->abi +
                                   " MPI shim; it cannot switch to the " + api->abi + " one");
  }
  api->set_combine(&CombineHalves);
  return Status::OK();
}

bool MpiLoaded() { return g_api.load() != nullptr; }

const so_mpi_api& Mpi() {
  const so_mpi_api* api = g_api.load(std::memory_order_relaxed);
  SO_CHECK(api != nullptr, "MPI was called before an MPI shim was loaded (so_use_mpi)");
  return *api;
}

Status MpiError(const char* what, int code) {
  char text[512];
  Mpi().error_string(code, text, sizeof(text));
  return Status::Transport(std::string(what) + " failed: " + text);
}

}  // namespace scaleout
