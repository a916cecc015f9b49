// The MPI shim the core calls (Note [One core, a shim per MPI ABI] in mpi/so_mpi.h): set once
// per process by so_use_mpi, before the first runtime starts.
#ifndef SCALEOUT_TRANSPORT_MPI_MPI_API_H_
#define SCALEOUT_TRANSPORT_MPI_MPI_API_H_

#include "common/status.h"
#include "mpi/so_mpi.h"

namespace scaleout {

// Takes `api` for the rest of the process. Refuses a table of another version, and a second
// shim once one is in use (one process has one MPI).
Status UseMpi(const so_mpi_api* api);
// Whether a shim is in use; Mpi() may be called only then.
bool MpiLoaded();
const so_mpi_api& Mpi();

// "MPI_Allreduce failed: <MPI's error string>"
Status MpiError(const char* what, int code);

}  // namespace scaleout

#endif  // SCALEOUT_TRANSPORT_MPI_MPI_API_H_
