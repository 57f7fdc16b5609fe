// TpStep encoding of runner calls: what a worker rebuilds is the call rank 0 made (the batch's
// tokens, positions and the block ids its positions need; rows' (chunk, token); draft lengths),
// through the real wire format; and the decoder refuses steps that do not fit their chunks.
#include "engine/parallel/tp_codec.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "engine/distributed/messages.h"
#include "engine/parallel/tp_internal.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

TpStep RoundTrip(const TpStep& step) {
  FrameBuffer frame;
  const WireLimits limits = TpWireLimits();
  EXPECT_TRUE(EncodeFrame(step, 7, limits, &frame).ok());
  Message decoded;
  auto header = DecodeFrame(frame.bytes(), limits, &decoded);
  EXPECT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->type, MessageType::kTpStep);
  return std::get<TpStep>(decoded);
}

TEST(TpCodecTest, WorkerRebuildsTheVerifyCallRankZeroMade) {
  // A prefill chunk, and a decode chunk carrying 3 drafts after its last committed token.
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9}, verify = {11, 12, 13, 14};
  const std::vector<int32_t> table_a = {3, 4, 99, 98}, table_b = {7, 8, 9};
  std::vector<SequenceInput> batch = {{prompt, 0, table_a, false}, {verify, 30, table_b, false}};
  std::vector<SampleRow> rows(2);
  rows[0].chunk = 0;
  rows[1].chunk = 1;
  rows[1].token = 0;
  const std::vector<int32_t> drafts_b = {12, 13, 14};
  std::vector<std::span<const int32_t>> drafts = {{}, drafts_b};
  TpStep step;
  EncodeTpStep(TpMethod::kGreedyVerify, batch, rows, drafts, /*block_size=*/16, 42, &step);
  // Only the blocks covering each chunk's positions travel: 5 tokens -> 1 block; 34 -> 3.
  EXPECT_EQ(step.block_ids, (std::vector<int32_t>{3, 7, 8, 9}));
  const TpStep wire = RoundTrip(step);
  EXPECT_EQ(wire, step);

  TpCall call;
  ASSERT_TRUE(call.Decode(wire).ok());
  ASSERT_EQ(call.batch().size(), 2u);
  EXPECT_EQ(std::vector<int32_t>(call.batch()[1].tokens.begin(), call.batch()[1].tokens.end()),
            verify);
  EXPECT_EQ(call.batch()[1].start_pos, 30);
  EXPECT_EQ(call.batch()[1].block_table.size(), 3u);
  ASSERT_EQ(call.rows().size(), 2u);
  EXPECT_EQ(call.rows()[1].chunk, 1);
  EXPECT_EQ(call.rows()[1].token, 0);
  ASSERT_NE(call.rows()[1].params, nullptr);  // greedy defaults: argument checks pass
  EXPECT_EQ(std::vector<int32_t>(call.drafts()[1].begin(), call.drafts()[1].end()), drafts_b);
  EXPECT_TRUE(call.drafts()[0].empty());
}

TEST(TpCodecTest, DecoderRefusesRowsAndBlocksThatDoNotFitTheirChunks) {
  const std::vector<int32_t> tokens = {1, 2};
  TpStep step;
  step.method = TpMethod::kStep;
  step.seqs = {TpSeq{0, 2, 1, false}};
  step.tokens = tokens;
  step.block_ids = {0};
  step.rows = {TpRow{1, -1, 0}};  // chunk 1 does not exist
  FrameBuffer frame;
  absl::Status s = EncodeFrame(step, 0, TpWireLimits(), &frame);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "rows[0].chunk")) << s;
  step.rows = {TpRow{0, -1, 2}};  // 2 drafts in a 2-token chunk
  s = EncodeFrame(step, 0, TpWireLimits(), &frame);
  EXPECT_TRUE(absl::StrContains(s.message(), "num_drafts")) << s;
  step.rows = {TpRow{0, -1, 0}};
  step.block_ids = {0, 1};  // more ids than the chunks hold
  s = EncodeFrame(step, 0, TpWireLimits(), &frame);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  step.block_ids = {0};
  EXPECT_TRUE(EncodeFrame(step, 0, TpWireLimits(), &frame).ok());
  // A draft in a call that verifies none is refused by the worker's rebuild.
  step.rows = {TpRow{0, 0, 1}};
  TpCall call;
  EXPECT_FALSE(call.Decode(step).ok());
}

TEST(TpCodecTest, InitReadyAndJoinRoundTrip) {
  const WireLimits limits = TpWireLimits();
  TpInit init;
  init.rank = 3;
  init.world_size = 4;
  init.model_dir = "/models/x";
  init.load_format = "dummy";
  init.comm_kind = "nccl";
  init.comm_token = std::vector<uint8_t>(128, 7);
  init.max_num_seqs = 64;
  init.kv_cache_bytes = uint64_t{1} << 33;
  init.enforce_eager = true;
  FrameBuffer frame;
  ASSERT_TRUE(EncodeFrame(init, 0, limits, &frame).ok());
  Message m;
  ASSERT_TRUE(DecodeFrame(frame.bytes(), limits, &m).ok());
  EXPECT_EQ(std::get<TpInit>(m), init);
  init.rank = 0;  // rank 0 is never a worker
  EXPECT_FALSE(EncodeFrame(init, 0, limits, &frame).ok());
  const TpReady ready{true, 1234, "cuda:1 H100", ""};
  ASSERT_TRUE(EncodeFrame(ready, 0, limits, &frame).ok());
  ASSERT_TRUE(DecodeFrame(frame.bytes(), limits, &m).ok());
  EXPECT_EQ(std::get<TpReady>(m), ready);
  const TpJoin join{2, "host-b"};
  ASSERT_TRUE(EncodeFrame(join, 0, limits, &frame).ok());
  ASSERT_TRUE(DecodeFrame(frame.bytes(), limits, &m).ok());
  EXPECT_EQ(std::get<TpJoin>(m), join);
}

TEST(TpCodecTest, LeaderAndWorkerHellosPairOnlyWithEachOther) {
  Hello leader, worker, verifier;
  leader.role = Role::kTpLeader;
  worker.role = Role::kTpWorker;
  verifier.role = Role::kVerifier;
  leader.limits = worker.limits = verifier.limits = TpWireLimits();
  EXPECT_EQ(HelloMismatch(leader, worker), "");
  EXPECT_NE(HelloMismatch(verifier, worker), "");
  EXPECT_NE(HelloMismatch(leader, leader), "");
}

// A group over several hosts needs a fixed port and the group's secret (a file or
// $SPECD_TP_SECRET); CPU ranks cannot span hosts; sizes must divide.
TEST(TpGroupOptionsTest, MultiNodeGroupsNeedAPortAndASecret) {
  TpGroupOptions g;
  g.world_size = 4;
  g.nnodes = 2;
  unsetenv(kTpSecretEnv);
  EXPECT_EQ(tp_internal::ValidateGroup(g).code(), absl::StatusCode::kInvalidArgument);
  g.master_port = 29500;
  absl::Status s = tp_internal::ValidateGroup(g);
  EXPECT_TRUE(absl::StrContains(s.message(), "SPECD_TP_SECRET")) << s;
  setenv(kTpSecretEnv, std::string(64, 'a').c_str(), 1);
  EXPECT_TRUE(tp_internal::ValidateGroup(g).ok());
  unsetenv(kTpSecretEnv);
  g.secret_file = "/etc/specd-tp/secret";
  EXPECT_TRUE(tp_internal::ValidateGroup(g).ok());
  g.nnodes = 3;  // 4 ranks over 3 hosts
  EXPECT_FALSE(tp_internal::ValidateGroup(g).ok());
  g.nnodes = 2;
  EXPECT_FALSE(tp_internal::CommunicatorKind("shm", /*cuda=*/false, g).ok());
  EXPECT_FALSE(tp_internal::CommunicatorKind("nccl", /*cuda=*/false, TpGroupOptions{}).ok());
  EXPECT_EQ(*tp_internal::CommunicatorKind("auto", /*cuda=*/false, TpGroupOptions{}), "shm");
}

}  // namespace
}  // namespace specd
