// FusedTensors (Note [Tensor fusion]): where a range of the fused elements lies in this rank's
// inputs and outputs (Input, Output), which the staged allreduce reads and writes in place
// (Note [Staged allreduce], Note [One-Sync allreduce]).
#include <cstdint>
#include <memory>
#include <vector>

#include "fusion/fused_tensors.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

// Tensors of these element counts (float32) fused in order; entry i null where joined[i].
struct Fused {
  Response response;
  std::vector<std::unique_ptr<TensorEntry>> owned;
  std::vector<TensorEntry*> entries;
  std::vector<std::vector<float>> inputs, outputs;

  Fused(const std::vector<int64_t>& counts, const std::vector<bool>& joined, double prescale = 1.0,
        std::vector<int64_t> part_first = {}) {
    response.dtype = DataType::kFloat32;
    response.prescale = prescale;
    for (size_t i = 0; i < counts.size(); ++i) {
      ResponseTensor t;
      t.shape = {counts[i]};
      const int64_t first = part_first.empty() ? 0 : part_first[i];
      if (first > 0) {
        t.part_first = first;
        t.part_count = counts[i] - first;
      }
      response.tensors.push_back(t);
      inputs.emplace_back(static_cast<size_t>(counts[i]), 1.0f);
      outputs.emplace_back(static_cast<size_t>(counts[i]), 0.0f);
      owned.push_back(std::make_unique<TensorEntry>());
      owned.back()->request.shape = {counts[i]};
      owned.back()->input = inputs.back().data();
      owned.back()->output = outputs.back().data();
      entries.push_back(joined[i] ? nullptr : owned.back().get());
    }
  }
  const uint8_t* In(size_t i, size_t at) const {
    return reinterpret_cast<const uint8_t*>(inputs[i].data() + at);
  }
  uint8_t* Out(size_t i, size_t at) { return reinterpret_cast<uint8_t*>(outputs[i].data() + at); }
};

SO_TEST(InputGivesTheRunOfOneTensorFromAnyElement) {
  // Counts 3, 0 (empty), 5, 2: fused elements [0,3) [3,3) [3,8) [8,10).
  Fused f({3, 0, 5, 2}, {false, false, false, false});
  const FusedTensors fused(f.response, f.entries, 1.0, true);
  size_t run = 0;
  EXPECT_TRUE(fused.Input(0, 10, &run) == f.In(0, 0));
  EXPECT_EQ(run, size_t(3));
  EXPECT_TRUE(fused.Input(1, 10, &run) == f.In(0, 1));
  EXPECT_EQ(run, size_t(2));
  EXPECT_TRUE(fused.Input(3, 7, &run) == f.In(2, 0));  // the empty tensor is skipped
  EXPECT_EQ(run, size_t(5));
  EXPECT_TRUE(fused.Input(4, 2, &run) == f.In(2, 1));  // cut by count
  EXPECT_EQ(run, size_t(2));
  EXPECT_TRUE(fused.Input(9, 1, &run) == f.In(3, 1));
  EXPECT_EQ(run, size_t(1));
}

SO_TEST(InputIsNullWhereTheElementsMustBePackedButStillGivesTheRun) {
  Fused joined({3, 4}, {false, true});  // the second tensor's rank joined: zeros are packed
  const FusedTensors a(joined.response, joined.entries, 1.0, true);
  size_t run = 0;
  EXPECT_TRUE(a.Input(3, 4, &run) == nullptr);
  EXPECT_EQ(run, size_t(4));
  Fused scaled({3, 4}, {false, false}, 0.5);  // a prescale: packing scales
  const FusedTensors b(scaled.response, scaled.entries, 1.0, true);
  EXPECT_TRUE(b.Input(0, 7, &run) == nullptr);
  EXPECT_EQ(run, size_t(3));
}

SO_TEST(InputAndOutputOfAPartStartAtThePartsFirstElement) {
  // Tensor 0 moves its elements [2, 6) only (Note [Priority]); tensor 1 whole.
  Fused f({6, 3}, {false, false}, 1.0, {2, 0});
  const FusedTensors fused(f.response, f.entries, 1.0, true);
  size_t run = 0;
  EXPECT_TRUE(fused.Input(0, 7, &run) == f.In(0, 2));
  EXPECT_EQ(run, size_t(4));
  EXPECT_TRUE(fused.Input(4, 3, &run) == f.In(1, 0));
  double post = 0;
  EXPECT_TRUE(fused.Output(1, 3, &post) == f.Out(0, 3));
  EXPECT_TRUE(fused.Output(0, 7, &post) == nullptr);  // two tensors: unpacked
}

SO_TEST(OutputIsOneTensorsAndTellsItsPostscale) {
  Fused f({5}, {false});
  const FusedTensors fused(f.response, f.entries, 0.25, false);
  double post = 0;
  EXPECT_TRUE(fused.Output(0, 5, &post) == f.Out(0, 0));
  EXPECT_TRUE(post == 0.25);
  Fused j({5}, {true});
  const FusedTensors joined(j.response, j.entries, 1.0, false);
  EXPECT_TRUE(joined.Output(0, 5, &post) == nullptr);  // a joined rank has no output
}

}  // namespace
}  // namespace scaleout
