// Note [Shared-memory control channel] in one process: the rings over plain memory, a fake
// network as the overflow channel. Order per sender survives a mix of ring and overflow
// messages; only rank 0 and each other rank talk. (The rings between two real processes:
// test_shm_peer_memory.cc.)
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/fake_channel.h"
#include "tests/test_framework.h"
#include "transport/shm/shm_control_channel.h"

namespace scaleout {
namespace {

// The fake network's channel for one rank, owned by the network: handed to a ShmControlChannel,
// which owns its overflow channel, through this forwarder.
class Forward : public ControlChannel {
 public:
  explicit Forward(ControlChannel* to) : to_(to) {}
  int rank() const override { return to_->rank(); }
  int size() const override { return to_->size(); }
  Status Send(int dest, std::vector<uint8_t> bytes) override {
    ++sent;
    return to_->Send(dest, std::move(bytes));
  }
  Status TryReceive(bool* got, int* src, std::vector<uint8_t>* bytes) override {
    return to_->TryReceive(got, src, bytes);
  }
  Status TryReceiveFrom(int src, bool* got, std::vector<uint8_t>* bytes) override {
    return to_->TryReceiveFrom(src, got, bytes);
  }
  int sent = 0;

 private:
  ControlChannel* to_;
};

// `size` ranks' channels over one block of zeroed memory, as the segment would hold them.
struct Star {
  explicit Star(int size) : network(size) {
    const size_t ring = ShmControlChannel::RingBytes();
    memory = static_cast<uint8_t*>(std::aligned_alloc(64, ring * 2 * static_cast<size_t>(size)));
    std::memset(memory, 0, ring * 2 * static_cast<size_t>(size));
    auto rings = [this, ring](int peer, bool toward_zero) {
      return memory + (static_cast<size_t>(peer - 1) * 2 + (toward_zero ? 0 : 1)) * ring;
    };
    for (int r = 0; r < size; ++r) {
      auto overflow = std::make_unique<Forward>(network.channel(r));
      overflows.push_back(overflow.get());
      channels.push_back(std::make_unique<ShmControlChannel>(r, size, rings, std::move(overflow)));
    }
  }
  ~Star() { std::free(memory); }
  ShmControlChannel& operator[](int r) { return *channels[static_cast<size_t>(r)]; }

  test::FakeNetwork network;
  uint8_t* memory;
  std::vector<Forward*> overflows;
  std::vector<std::unique_ptr<ShmControlChannel>> channels;
};

std::vector<uint8_t> Message(int tag, size_t bytes) {
  std::vector<uint8_t> m(bytes, static_cast<uint8_t>(tag));
  if (bytes >= sizeof tag) std::memcpy(m.data(), &tag, sizeof tag);
  return m;
}

int TagOf(const std::vector<uint8_t>& m) {
  int tag = -1;
  if (m.size() >= sizeof tag) std::memcpy(&tag, m.data(), sizeof tag);
  return tag;
}

SO_TEST(ShmControlChannelSmallMessagesGoThroughTheRingInOrder) {
  Star star(2);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(star[1].Send(0, Message(i, 40 + i)).ok());
  EXPECT_EQ(star.overflows[1]->sent, 0);
  for (int i = 0; i < 100; ++i) {
    bool got = false;
    int src = -1;
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(star[0].TryReceive(&got, &src, &bytes).ok());
    ASSERT_TRUE(got);
    EXPECT_EQ(src, 1);
    EXPECT_EQ(bytes.size(), 40 + i);
    EXPECT_EQ(TagOf(bytes), i);
  }
  bool got = true;
  int src = -1;
  std::vector<uint8_t> bytes;
  EXPECT_TRUE(star[0].TryReceive(&got, &src, &bytes).ok());
  EXPECT_FALSE(got);
  // An empty message, and the way back.
  ASSERT_TRUE(star[0].Send(1, {}).ok());
  EXPECT_TRUE(star[1].TryReceiveFrom(0, &got, &bytes).ok());
  EXPECT_TRUE(got);
  EXPECT_EQ(bytes.size(), 0);
}

SO_TEST(ShmControlChannelKeepsOrderAcrossTheOverflowChannel) {
  Star star(2);
  // A message too large for the ring, between small ones; then enough to fill the ring, so
  // that later small ones overflow too; nothing is received until all are sent.
  std::vector<size_t> sizes = {16, 200000, 16, 7};
  for (int i = 0; i < 300; ++i) sizes.push_back(1000);
  sizes.push_back(5);
  for (size_t i = 0; i < sizes.size(); ++i)
    ASSERT_TRUE(star[0].Send(1, Message(static_cast<int>(i), sizes[i])).ok());
  EXPECT_TRUE(star.overflows[0]->sent > 1);
  for (size_t i = 0; i < sizes.size(); ++i) {
    bool got = false;
    int src = -1;
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(star[1].TryReceive(&got, &src, &bytes).ok());
    ASSERT_TRUE(got);
    EXPECT_EQ(src, 0);
    if (!EXPECT_EQ(TagOf(bytes), static_cast<int>(i))) ADD_FAILURE("message " + std::to_string(i));
    EXPECT_EQ(bytes.size(), sizes[i]);
  }
}

SO_TEST(ShmControlChannelRankZeroHearsEveryRankAndOnlyTheStarTalks) {
  Star star(4);
  for (int r = 1; r < 4; ++r) {
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(star[r].Send(0, Message(r * 10 + i, 8)).ok());
  }
  std::vector<int> next(4, 0);
  for (int n = 0; n < 9; ++n) {
    bool got = false;
    int src = -1;
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(star[0].TryReceive(&got, &src, &bytes).ok());
    ASSERT_TRUE(got && src >= 1 && src < 4);
    EXPECT_EQ(TagOf(bytes), src * 10 + next[static_cast<size_t>(src)]++);
  }
  EXPECT_EQ(next[1] + next[2] + next[3], 9);
  EXPECT_EQ(star[1].Send(2, Message(0, 8)).code(), SO_ERR_INTERNAL);
  EXPECT_EQ(star[0].Send(0, Message(0, 8)).code(), SO_ERR_INTERNAL);
  EXPECT_EQ(star[2].Send(5, Message(0, 8)).code(), SO_ERR_INTERNAL);
}

}  // namespace
}  // namespace scaleout
