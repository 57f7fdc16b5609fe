// TpStep encoding of runner calls: what a worker rebuilds is the call rank 0 made (the batch's
// tokens, positions and the block ids its positions need; rows' (chunk, token); draft lengths),
// through the real wire format; and the decoder refuses steps that do not fit their chunks.
#include "engine/parallel/tp_codec.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "engine/distributed/messages.h"
#include "engine/parallel/tp_handshake.h"
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
  EncodeTpStep(TpMethod::kGreedyVerify, batch, rows, drafts, /*block_size=*/16, 42,
               /*mirror=*/nullptr, &step);
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
  step.seqs = {TpSeq{0, 2, 1, false, -1, 0}};
  step.tokens = tokens;
  step.block_ids = {0};
  step.rows = {TpRow{1, -1, 0, 0, false}};  // chunk 1 does not exist
  FrameBuffer frame;
  absl::Status s = EncodeFrame(step, 0, TpWireLimits(), &frame);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "rows[0].chunk")) << s;
  step.rows = {TpRow{0, -1, 2, 0, false}};  // 2 drafts in a 2-token chunk
  s = EncodeFrame(step, 0, TpWireLimits(), &frame);
  EXPECT_TRUE(absl::StrContains(s.message(), "num_drafts")) << s;
  step.rows = {TpRow{0, -1, 0, 0, false}};
  step.block_ids = {0, 1};  // more ids than the chunks hold
  s = EncodeFrame(step, 0, TpWireLimits(), &frame);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  step.block_ids = {0};
  EXPECT_TRUE(EncodeFrame(step, 0, TpWireLimits(), &frame).ok());
  // A draft in a call that verifies none is refused by the worker's rebuild.
  step.rows = {TpRow{0, 0, 1, 0, false}};
  TpCall call;
  EXPECT_FALSE(call.Decode(step).ok());
}

// Block tables travel as deltas against the workers' mirrors: a growing table sends only its new
// ids, a table whose tail changed (a rollback, a re-admission) resends from the first difference,
// and the worker rebuilds rank 0's table every step. An idle mirror is dropped on both sides.
TEST(TpCodecTest, BlockTablesTravelAsDeltasAgainstTheWorkersMirror) {
  TpBlockMirror mirror;
  TpCall call;
  const std::vector<int32_t> token = {1};
  std::vector<SampleRow> rows(1);
  struct Step {
    int32_t start_pos;
    std::vector<int32_t> table;
    std::vector<int32_t> carried;
  };
  // Block size 4: position p needs ceil((p + 1) / 4) blocks.
  const std::vector<Step> steps = {
      {5, {3, 4}, {3, 4}},     // first sight: everything
      {6, {3, 4}, {}},         // same blocks: nothing
      {8, {3, 4, 9}, {9}},     // a new block
      {9, {3, 8, 9}, {8, 9}},  // the tail changed: from the first difference
      {2, {3, 8, 9}, {}},      // a shorter chunk needs 1 block, kept from the mirror
  };
  uint64_t id = 1;
  for (const Step& st : steps) {
    SCOPED_TRACE(testing::Message() << "step " << id);
    const std::vector<SequenceInput> batch = {{token, st.start_pos, st.table, false, 17}};
    TpStep step;
    EncodeTpStep(TpMethod::kStep, batch, rows, {}, /*block_size=*/4, id++, &mirror, &step);
    EXPECT_EQ(step.block_ids, st.carried);
    const TpStep wire = RoundTrip(step);
    ASSERT_TRUE(call.Decode(wire).ok());
    const size_t need = static_cast<size_t>(st.start_pos / 4 + 1);
    const std::span<const int32_t> got = call.batch()[0].block_table;
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()),
              std::vector<int32_t>(st.table.begin(), st.table.begin() + need));
  }
  EXPECT_EQ(call.num_mirrors(), 1u);
  // Another sequence until step 128 (mirrors expire every kIdleSteps steps): sequence 17, idle
  // since step 5, is released then, and sequence 18 is not.
  const std::vector<int32_t> other = {5};
  TpStep step;
  for (; id <= 2 * TpBlockMirror::kIdleSteps; ++id) {
    const std::vector<SequenceInput> batch = {{token, 0, other, false, 18}};
    EncodeTpStep(TpMethod::kStep, batch, rows, {}, 4, id, &mirror, &step);
    ASSERT_TRUE(call.Decode(RoundTrip(step)).ok());
  }
  EXPECT_EQ(step.released, (std::vector<int64_t>{17}));
  EXPECT_EQ(mirror.size(), 1u);
  EXPECT_EQ(call.num_mirrors(), 1u);
}

// A step that keeps more of a mirror than the worker holds means the ranks disagree: refused.
TEST(TpCodecTest, WorkerRefusesAStepKeepingBlocksItNeverGot) {
  TpStep step;
  step.method = TpMethod::kStep;
  step.seqs = {TpSeq{20, 1, 2, false, /*seq_id=*/9, /*kept_blocks=*/2}};
  step.tokens = {1};
  TpCall call;
  const absl::Status s = call.Decode(RoundTrip(step));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "mirror holds 0")) << s;
  // One sequence in two chunks of a step: the second would move the first one's table.
  step.seqs = {TpSeq{0, 1, 1, false, 9, 0}, TpSeq{0, 1, 1, false, 9, 0}};
  step.tokens = {1, 2};
  step.block_ids = {4, 5};
  const absl::Status twice = call.Decode(RoundTrip(step));
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(twice.message(), "chunks 0 and 1")) << twice;
  step.seqs = {TpSeq{20, 1, 2, false, -1, 2}};  // kept blocks without a mirror: malformed
  step.tokens = {1};
  step.block_ids = {};
  FrameBuffer frame;
  EXPECT_FALSE(EncodeFrame(step, 0, TpWireLimits(), &frame).ok());
}

// What the vocabulary merge needs travels with each row, so a worker's runner picks the same
// merge as rank 0's: the largest candidate count, and full rows when any row samples.
TEST(TpCodecTest, WorkerRowsMergeTheVocabularyAsRankZeros) {
  const std::vector<int32_t> a = {1}, b = {2}, table = {0};
  const std::vector<SequenceInput> batch = {{a, 0, table, false}, {b, 0, table, false}};
  SamplingParams greedy, sampled;
  greedy.temperature = 0.0f;
  std::vector<SampleRow> rows(2);
  for (int i = 0; i < 2; ++i) {
    rows[i].chunk = i;
    rows[i].params = &greedy;
  }
  rows[1].num_candidates = 4;
  for (const bool sample : {false, true}) {
    rows[0].params = sample ? &sampled : &greedy;
    TpStep step;
    EncodeTpStep(TpMethod::kStep, batch, rows, {}, 16, 1, nullptr, &step);
    TpCall call;
    ASSERT_TRUE(call.Decode(RoundTrip(step)).ok());
    EXPECT_EQ(VocabMergeK(call.rows()), VocabMergeK(rows));
    EXPECT_EQ(VocabMergeK(rows), sample ? 0 : 4);
  }
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
  EXPECT_EQ(tp_handshake::ValidateGroup(g).code(), absl::StatusCode::kInvalidArgument);
  g.master_port = 29500;
  absl::Status s = tp_handshake::ValidateGroup(g);
  EXPECT_TRUE(absl::StrContains(s.message(), "SPECD_TP_SECRET")) << s;
  setenv(kTpSecretEnv, std::string(64, 'a').c_str(), 1);
  EXPECT_TRUE(tp_handshake::ValidateGroup(g).ok());
  unsetenv(kTpSecretEnv);
  g.secret_file = "/etc/specd-tp/secret";
  EXPECT_TRUE(tp_handshake::ValidateGroup(g).ok());
  g.nnodes = 3;  // 4 ranks over 3 hosts
  EXPECT_FALSE(tp_handshake::ValidateGroup(g).ok());
  g.nnodes = 2;
  EXPECT_FALSE(tp_handshake::CommunicatorKind("shm", /*cuda=*/false, g).ok());
  EXPECT_FALSE(tp_handshake::CommunicatorKind("nccl", /*cuda=*/false, TpGroupOptions{}).ok());
  EXPECT_EQ(*tp_handshake::CommunicatorKind("auto", /*cuda=*/false, TpGroupOptions{}), "shm");
}

}  // namespace
}  // namespace specd
