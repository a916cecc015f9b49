// result_memory (Note [Result memory]): a freed large block serves the next request of about
// its size, small ones never wait in the pool, and what is kept stays within its bounds.
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/result_memory.h"
#include "runtime/tensor_entry.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

constexpr size_t MiB = size_t(1) << 20;

SO_TEST(ResultMemoryReusesAFreedBlockForTheSameSize) {
  result_memory::Trim();
  void* a = result_memory::Allocate(32 * MiB);
  std::memset(a, 1, 32 * MiB);
  result_memory::Release(a, 32 * MiB);
  EXPECT_EQ(result_memory::Kept(), 32 * MiB);
  void* b = result_memory::Allocate(32 * MiB);
  EXPECT_TRUE(b == a);
  EXPECT_EQ(result_memory::Kept(), 0);
  result_memory::Release(b, 32 * MiB);
  // A smaller request takes it while it uses at least half; a larger one does not.
  void* c = result_memory::Allocate(20 * MiB);
  EXPECT_TRUE(c == a);
  result_memory::Release(c, 20 * MiB);
  EXPECT_EQ(result_memory::Kept(), 32 * MiB);  // its real size came back
  void* d = result_memory::Allocate(15 * MiB);
  void* e = result_memory::Allocate(33 * MiB);
  EXPECT_TRUE(d != a && e != a);
  result_memory::Release(d, 15 * MiB);
  result_memory::Release(e, 33 * MiB);
  result_memory::Trim();
}

SO_TEST(ResultMemoryKeepsNoSmallBlocksAndStaysWithinItsBounds) {
  result_memory::Trim();
  void* small = result_memory::Allocate(result_memory::kReusedFrom - 1);
  result_memory::Release(small, result_memory::kReusedFrom - 1);
  EXPECT_EQ(result_memory::Kept(), 0);
  std::vector<void*> blocks;
  for (size_t i = 0; i < result_memory::kKeptBlocks + 2; ++i)
    blocks.push_back(result_memory::Allocate(2 * MiB));
  for (void* p : blocks) result_memory::Release(p, 2 * MiB);
  EXPECT_EQ(result_memory::Kept(), result_memory::kKeptBlocks * 2 * MiB);
  result_memory::Trim();
  // Bytes: three blocks of 200 MiB would exceed 512 MiB; the oldest goes (pages never touched).
  for (int i = 0; i < 3; ++i) blocks[i] = result_memory::Allocate(200 * MiB);
  for (int i = 0; i < 3; ++i) result_memory::Release(blocks[i], 200 * MiB);
  EXPECT_EQ(result_memory::Kept(), 400 * MiB);
  result_memory::Trim();
}

SO_TEST(ResultBytesTakeTheirMemoryFromThePool) {
  result_memory::Trim();
  const uint8_t* first;
  {
    ResultBytes r;
    r.resize(3 * MiB);
    first = r.data();
  }
  EXPECT_EQ(result_memory::Kept(), 3 * MiB);
  ResultBytes again;
  again.resize(3 * MiB);
  EXPECT_TRUE(again.data() == first);
  again = ResultBytes();
  result_memory::Trim();
}

}  // namespace
}  // namespace scaleout
