// An MPI shim (Note [One core, a shim per MPI ABI]): so_mpi.h's table for the MPI whose header
// this is compiled against. Nothing here decides anything; it translates neutral handles, types
// and ops to this ABI's and calls MPI. Built once per ABI (native/build_native.py).
#include <mpi.h>

#include <array>
#include <cstring>
#include <type_traits>

#include "mpi/so_mpi.h"

#define SO_SHIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// A handle is an int in the MPICH ABI and a pointer in the others; 0 stands for its null.
template <typename H>
H From(so_mpi_handle h, H null) {
  if (h == 0) return null;
  if constexpr (std::is_pointer_v<H>) {
    return reinterpret_cast<H>(h);
  } else {
    return static_cast<H>(h);
  }
}

template <typename H>
so_mpi_handle To(H h, H null) {
  if (h == null) return 0;
  if constexpr (std::is_pointer_v<H>) {
    return reinterpret_cast<so_mpi_handle>(h);
  } else {
    return static_cast<so_mpi_handle>(h);
  }
}

MPI_Comm Comm(so_mpi_handle h) { return From<MPI_Comm>(h, MPI_COMM_NULL); }
so_mpi_handle Handle(MPI_Comm c) { return To<MPI_Comm>(c, MPI_COMM_NULL); }

// Runs an MPI call that makes a request and stores it as a handle.
template <typename Call>
int Started(so_mpi_handle* out, Call call) {
  MPI_Request request = MPI_REQUEST_NULL;
  int rc = call(&request);
  *out = To<MPI_Request>(request, MPI_REQUEST_NULL);
  return rc;
}

MPI_Datatype Type(int type) {
  switch (type) {
    case SO_MPI_INT:
      return MPI_INT;
    case SO_MPI_INT8:
      return MPI_INT8_T;
    case SO_MPI_UINT8:
      return MPI_UINT8_T;
    case SO_MPI_INT16:
      return MPI_INT16_T;
    case SO_MPI_UINT16:
      return MPI_UINT16_T;
    case SO_MPI_INT32:
      return MPI_INT32_T;
    case SO_MPI_INT64:
      return MPI_INT64_T;
    case SO_MPI_FLOAT:
      return MPI_FLOAT;
    case SO_MPI_DOUBLE:
      return MPI_DOUBLE;
    case SO_MPI_C_BOOL:
      return MPI_C_BOOL;
    default:
      return MPI_BYTE;
  }
}

so_mpi_combine_fn g_combine = nullptr;

template <int kHalf, int kOp>
void CombineHalves(void* in, void* inout, int* len, MPI_Datatype*) {
  g_combine(inout, in, *len, kHalf, kOp);
}

template <int kHalf>
std::array<MPI_Op, 4> MakeHalfOps() {
  std::array<MPI_Op, 4> ops;
  MPI_Op_create(&CombineHalves<kHalf, SO_MPI_SUM>, 1, &ops[SO_MPI_SUM]);
  MPI_Op_create(&CombineHalves<kHalf, SO_MPI_MIN>, 1, &ops[SO_MPI_MIN]);
  MPI_Op_create(&CombineHalves<kHalf, SO_MPI_MAX>, 1, &ops[SO_MPI_MAX]);
  MPI_Op_create(&CombineHalves<kHalf, SO_MPI_PROD>, 1, &ops[SO_MPI_PROD]);
  return ops;
}

MPI_Op Op(int op) {
  switch (op) {
    case SO_MPI_SUM:
      return MPI_SUM;
    case SO_MPI_MIN:
      return MPI_MIN;
    case SO_MPI_MAX:
      return MPI_MAX;
    case SO_MPI_PROD:
      return MPI_PROD;
    case SO_MPI_LAND:
      return MPI_LAND;
    case SO_MPI_LOR:
      return MPI_LOR;
    default:
      break;
  }
  // Made on first use (MPI is initialised by then) and kept until MPI_Finalize.
  static const std::array<MPI_Op, 4> float16 = MakeHalfOps<SO_MPI_FLOAT16>();
  static const std::array<MPI_Op, 4> bfloat16 = MakeHalfOps<SO_MPI_BFLOAT16>();
  const int half = (op - SO_MPI_HALF_OPS) / 4;
  return (half == SO_MPI_FLOAT16 ? float16 : bfloat16)[(op - SO_MPI_HALF_OPS) % 4];
}

const void* Send(const void* send) { return send == nullptr ? MPI_IN_PLACE : send; }

void CopyCut(const char* from, char* text, int capacity) {
  if (capacity <= 0) return;
  std::strncpy(text, from, static_cast<size_t>(capacity) - 1);
  text[capacity - 1] = '\0';
}

#define SO_STRINGIFY_(x) #x
#define SO_STRINGIFY(x) SO_STRINGIFY_(x)

const char* BuiltWith() {
#if defined(OMPI_MAJOR_VERSION)
  return "Open MPI " SO_STRINGIFY(OMPI_MAJOR_VERSION) "." SO_STRINGIFY(
      OMPI_MINOR_VERSION) "." SO_STRINGIFY(OMPI_RELEASE_VERSION) " headers";
#elif defined(I_MPI_VERSION)
  return "Intel MPI " I_MPI_VERSION " headers";
#elif defined(MPICH_VERSION)
  return "MPICH " MPICH_VERSION " headers";
#else
  return "MPI " SO_STRINGIFY(MPI_VERSION) "." SO_STRINGIFY(MPI_SUBVERSION) " headers";
#endif
}

const char* Abi() {
#if defined(SCALEOUT_MPI_ABI_NAME)
  return SCALEOUT_MPI_ABI_NAME;  // set by the build (the standard ABI's header is MPICH's too)
#elif defined(OMPI_MAJOR_VERSION)
  return "openmpi";
#else
  return "mpich";
#endif
}

const so_mpi_api kApi = {
    sizeof(so_mpi_api),
    SO_MPI_API_VERSION,
    Abi(),
    BuiltWith(),
    [](so_mpi_combine_fn fn) { g_combine = fn; },
    [](char* text, int capacity) {
      char version[MPI_MAX_LIBRARY_VERSION_STRING];
      int len = 0;
      int rc = MPI_Get_library_version(version, &len);
      CopyCut(rc == MPI_SUCCESS ? version : "", text, capacity);
      return rc;
    },
    [](int* flag) { return MPI_Initialized(flag); },
    [](int* flag) { return MPI_Finalized(flag); },
    []() {
      int provided = 0;
      return MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    },
    [](int* level) {
      int mpi_level = 0;
      int rc = MPI_Query_thread(&mpi_level);
      *level = mpi_level == MPI_THREAD_SINGLE       ? 0
               : mpi_level == MPI_THREAD_FUNNELED   ? 1
               : mpi_level == MPI_THREAD_SERIALIZED ? 2
                                                    : 3;
      return rc;
    },
    []() { return MPI_Finalize(); },
    [](int code, char* text, int capacity) {
      char message[MPI_MAX_ERROR_STRING];
      int len = 0;
      if (MPI_Error_string(code, message, &len) != MPI_SUCCESS) len = 0;
      message[len] = '\0';
      CopyCut(message, text, capacity);
    },
    []() { return Handle(MPI_COMM_WORLD); },
    [](int64_t c_handle, so_mpi_handle* comm) {
      *comm = Handle(From<MPI_Comm>(static_cast<so_mpi_handle>(c_handle), MPI_COMM_NULL));
      return 0;
    },
    [](so_mpi_handle comm, so_mpi_handle* out) {
      MPI_Comm dup = MPI_COMM_NULL;
      int rc = MPI_Comm_dup(Comm(comm), &dup);
      if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
      *out = Handle(dup);
      return rc;
    },
    [](so_mpi_handle* comm) {
      MPI_Comm c = Comm(*comm);
      int rc = MPI_Comm_free(&c);
      *comm = Handle(c);
      return rc;
    },
    [](so_mpi_handle comm, int* rank) { return MPI_Comm_rank(Comm(comm), rank); },
    [](so_mpi_handle comm, int* size) { return MPI_Comm_size(Comm(comm), size); },
    [](so_mpi_handle comm, int color, int key, so_mpi_handle* out) {
      MPI_Comm split = MPI_COMM_NULL;
      int rc = MPI_Comm_split(Comm(comm), color < 0 ? MPI_UNDEFINED : color, key, &split);
      *out = Handle(split);
      return rc;
    },
    [](so_mpi_handle comm, int key, so_mpi_handle* out) {
      MPI_Comm split = MPI_COMM_NULL;
      int rc = MPI_Comm_split_type(Comm(comm), MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, &split);
      *out = Handle(split);
      return rc;
    },
    [](so_mpi_handle comm, const int* ranks, int nranks, int tag, so_mpi_handle* out) {
      MPI_Group all = MPI_GROUP_NULL, some = MPI_GROUP_NULL;
      MPI_Comm made = MPI_COMM_NULL;
      int rc = MPI_Comm_group(Comm(comm), &all);
      if (rc == MPI_SUCCESS) rc = MPI_Group_incl(all, nranks, ranks, &some);
      if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(Comm(comm), some, tag, &made);
      if (rc == MPI_SUCCESS && made != MPI_COMM_NULL) {
        rc = MPI_Comm_set_errhandler(made, MPI_ERRORS_RETURN);
      }
      if (some != MPI_GROUP_NULL) MPI_Group_free(&some);
      if (all != MPI_GROUP_NULL) MPI_Group_free(&all);
      *out = Handle(made);
      return rc;
    },
    [](const void* send, void* recv, int count, int type, int op, so_mpi_handle comm) {
      return MPI_Allreduce(Send(send), recv, count, Type(type), Op(op), Comm(comm));
    },
    [](const void* send, int count, int type, void* recv, so_mpi_handle comm) {
      return MPI_Allgather(send, count, Type(type), recv, count, Type(type), Comm(comm));
    },
    [](void* buf, int count, int type, int root, so_mpi_handle comm) {
      return MPI_Bcast(buf, count, Type(type), root, Comm(comm));
    },
    [](const void* send, void* recv, int count, int type, int op, so_mpi_handle comm,
       so_mpi_handle* request) {
      return Started(request, [&](MPI_Request* r) {
        return MPI_Iallreduce(Send(send), recv, count, Type(type), Op(op), Comm(comm), r);
      });
    },
    [](const void* send, int bytes, void* recv, const int* recv_bytes, const int* displs,
       so_mpi_handle comm, so_mpi_handle* request) {
      return Started(request, [&](MPI_Request* r) {
        return MPI_Iallgatherv(send, bytes, MPI_BYTE, recv, recv_bytes, displs, MPI_BYTE,
                               Comm(comm), r);
      });
    },
    [](void* buf, int bytes, int root, so_mpi_handle comm, so_mpi_handle* request) {
      return Started(request, [&](MPI_Request* r) {
        return MPI_Ibcast(buf, bytes, MPI_BYTE, root, Comm(comm), r);
      });
    },
    [](const void* send, const int* send_bytes, const int* send_displs, void* recv,
       const int* recv_bytes, const int* recv_displs, so_mpi_handle comm, so_mpi_handle* request) {
      return Started(request, [&](MPI_Request* r) {
        return MPI_Ialltoallv(send, send_bytes, send_displs, MPI_BYTE, recv, recv_bytes,
                              recv_displs, MPI_BYTE, Comm(comm), r);
      });
    },
    [](const void* send, void* recv, const int* counts, int type, int op, so_mpi_handle comm,
       so_mpi_handle* request) {
      return Started(request, [&](MPI_Request* r) {
        return MPI_Ireduce_scatter(send, recv, counts, Type(type), Op(op), Comm(comm), r);
      });
    },
    [](const void* buf, int bytes, int dest, int tag, so_mpi_handle comm, so_mpi_handle* request) {
      return Started(request, [&](MPI_Request* r) {
        return MPI_Isend(buf, bytes, MPI_BYTE, dest, tag, Comm(comm), r);
      });
    },
    [](void* buf, int bytes, int source, int tag, so_mpi_handle comm, so_mpi_handle* request) {
      return Started(request, [&](MPI_Request* r) {
        return MPI_Irecv(buf, bytes, MPI_BYTE, source, tag, Comm(comm), r);
      });
    },
    [](so_mpi_handle* request, int* done) {
      MPI_Request r = From<MPI_Request>(*request, MPI_REQUEST_NULL);
      int rc = MPI_Test(&r, done, MPI_STATUS_IGNORE);
      *request = To<MPI_Request>(r, MPI_REQUEST_NULL);
      return rc;
    },
    [](so_mpi_handle* request) {
      MPI_Request r = From<MPI_Request>(*request, MPI_REQUEST_NULL);
      int rc = MPI_Wait(&r, MPI_STATUS_IGNORE);
      *request = To<MPI_Request>(r, MPI_REQUEST_NULL);
      return rc;
    },
    [](int source, int tag, so_mpi_handle comm, int* flag, int* source_out, int* bytes) {
      MPI_Status status;
      int rc = MPI_Iprobe(source < 0 ? MPI_ANY_SOURCE : source, tag, Comm(comm), flag, &status);
      if (rc == MPI_SUCCESS && *flag) {
        *source_out = status.MPI_SOURCE;
        rc = MPI_Get_count(&status, MPI_BYTE, bytes);
      }
      return rc;
    },
    [](void* buf, int bytes, int source, int tag, so_mpi_handle comm) {
      return MPI_Recv(buf, bytes, MPI_BYTE, source, tag, Comm(comm), MPI_STATUS_IGNORE);
    },
};

}  // namespace

SO_SHIM_EXPORT const so_mpi_api* so_mpi_api_get(void) { return &kApi; }
