// Memory for the results the core allocates (allgather, alltoall, reducescatter): large blocks
// freed by the caller are kept for the next result of about their size. See Note [Result
// memory].
//
// Threading: any thread (results are made on coordinator threads and freed wherever the
// caller drops them).
#ifndef SCALEOUT_RUNTIME_RESULT_MEMORY_H_
#define SCALEOUT_RUNTIME_RESULT_MEMORY_H_

#include <cstddef>

namespace scaleout {
namespace result_memory {

// At least `bytes` bytes, uninitialized; never null (throws std::bad_alloc).
void* Allocate(size_t bytes);
// Gives back what Allocate(bytes) returned.
void Release(void* block, size_t bytes);

// Blocks of at least this many bytes are kept for reuse; smaller ones go straight to the heap.
constexpr size_t kReusedFrom = size_t(1) << 20;
// What is kept at most (bytes, blocks); the oldest kept block goes first.
constexpr size_t kKeptBytes = size_t(512) << 20;
constexpr size_t kKeptBlocks = 4;
// Kept bytes now.
size_t Kept();
// Frees every kept block (at shutdown).
void Trim();

}  // namespace result_memory
}  // namespace scaleout

#endif  // SCALEOUT_RUNTIME_RESULT_MEMORY_H_
