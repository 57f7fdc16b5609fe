// The draft-vocabulary launchers' contracts beyond the op table's value checks (kernels/check/
// op_table_draft.cc): sizes they refuse, empty launches, MapIds in place and ExpandColumns from
// a misaligned destination, both captured in one CUDA graph as a draft step would run them. Part
// of kernels_cuda_test.
#include "kernels/cuda/draft_vocab.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/check/cuda_check.h"
#include "kernels/ref/draft_vocab.h"

namespace specd::kernels {
namespace {

using check::DeviceBuffer;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TEST(DraftVocabCudaTest, RefusesSizesItCannotRun) {
  DeviceBuffer a(64), b(64), c(64);
  const auto* ids = a.as<int32_t>();
  EXPECT_EQ(MapIds(ids, -1, b.as<int32_t>(), 4, c.as<int32_t>(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(MapIds(ids, 4, b.as<int32_t>(), 0, c.as<int32_t>(), nullptr), cudaErrorInvalidValue);
  const auto* src = a.as<float>();
  const auto* cols = b.as<int32_t>();
  float* dst = c.as<float>();
  // {src_stride, rows, src cols, dst_stride, dst cols}
  for (const auto& [src_stride, rows, src_cols, dst_stride, dst_cols] :
       std::vector<std::tuple<int64_t, int32_t, int32_t, int64_t, int32_t>>{
           {4, -1, 4, 8, 8}, {4, 1, 0, 8, 8}, {8, 1, 8, 4, 4}, {3, 1, 4, 8, 8}, {4, 1, 4, 7, 8}}) {
    EXPECT_EQ(ExpandColumns(src, src_stride, rows, src_cols, cols, dst, dst_stride, dst_cols,
                            kNegInf, nullptr),
              cudaErrorInvalidValue)
        << src_stride << " " << rows << " " << src_cols << " " << dst_stride << " " << dst_cols;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(DraftVocabCudaTest, EmptyLaunchesQueueNothing) {
  // Null pointers: a launch that touched them would fault.
  EXPECT_EQ(MapIds(nullptr, 0, nullptr, 1, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(ExpandColumns(nullptr, 8, 0, 8, nullptr, nullptr, 16, 16, kNegInf, nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// A draft step's tail in a graph: the head's draws mapped to target ids in place, its logits
// expanded over the target vocabulary into a destination one float past an aligned address
// (the scalar stores; each row cut into 4 chunks on a 132-SM GPU).
TEST(DraftVocabCudaTest, InPlaceMapAndMisalignedExpandCapturedInAGraphMatchTheReference) {
  constexpr int32_t kRows = 3, kDraftVocab = 5000, kVocab = 20000;
  std::mt19937_64 rng(0xd7af);
  std::vector<int32_t> map(kVocab);
  std::iota(map.begin(), map.end(), 0);
  std::shuffle(map.begin(), map.end(), rng);
  map.resize(kDraftVocab);
  std::vector<int32_t> ids = {0, kDraftVocab - 1, -1, kDraftVocab, 17, 4242};
  std::vector<float> src(kRows * kDraftVocab);
  std::uniform_real_distribution<float> value(-8.0f, 8.0f);
  for (float& x : src) x = value(rng);

  DeviceBuffer map_dev(map.size() * 4), ids_dev(ids.size() * 4), src_dev(src.size() * 4),
      cols_dev(map.size() * 4), dst_dev((kRows * kVocab + 1) * 4);
  map_dev.Upload(map);
  cols_dev.Upload(map);
  ids_dev.Upload(ids);
  src_dev.Upload(src);
  dst_dev.Poison();
  float* dst = dst_dev.as<float>() + 1;

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(MapIds(ids_dev.as<int32_t>(), static_cast<int32_t>(ids.size()), map_dev.as<int32_t>(),
                   kDraftVocab, ids_dev.as<int32_t>(), stream),
            cudaSuccess);
  ASSERT_EQ(ExpandColumns(src_dev.as<float>(), kDraftVocab, kRows, kDraftVocab,
                          cols_dev.as<int32_t>(), dst, kVocab, kVocab, kNegInf, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  std::vector<int32_t> want_ids(ids.size());
  ref::MapIds(ids.data(), static_cast<int32_t>(ids.size()), map.data(), kDraftVocab,
              want_ids.data());
  EXPECT_EQ(ids_dev.Download<int32_t>(), want_ids);
  std::vector<float> want(kRows * kVocab + 1);
  std::memset(want.data(), 0xff, want.size() * 4);
  ref::ExpandColumns(src.data(), kDraftVocab, kRows, kDraftVocab, map.data(), want.data() + 1,
                     kVocab, kVocab, kNegInf);
  const std::vector<float> got = dst_dev.Download<float>();
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace specd::kernels
