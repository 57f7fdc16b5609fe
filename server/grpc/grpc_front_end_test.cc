// The gRPC front end over a real serving Engine (codepair model, CPU) and a real gRPC
// client on loopback: streaming, goldens, errors, cancel / deadline / Abort freeing the KV
// cache, auth and shutdown.
#include "server/grpc/grpc_front_end.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/engine.h"
#include "proto/specd.grpc.pb.h"

namespace specd {
namespace {

constexpr const char* kModelDir = SPECD_SOURCE_DIR "/models/codepair/target";
constexpr const char* kGolden = SPECD_SHARED_DIR "/models/codepair/golden.json";

struct Stream {
  std::vector<int32_t> ids;
  std::string text;
  std::vector<v1::GenerateResponse> messages;
  grpc::Status status;
};

class GrpcFrontEndTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions options;
    options.model_dir = kModelDir;
    options.num_threads = 2;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = engine->release();
    ASSERT_TRUE(engine_->Start().ok());
    GrpcFrontEndOptions fe;
    fe.host = "127.0.0.1";
    fe.port = 0;
    fe.served_model_name = "codepair";
    fe.version = "test-1";
    fe.model_dir = kModelDir;
    absl::StatusOr<std::unique_ptr<GrpcFrontEnd>> front_end = GrpcFrontEnd::Start(engine_, fe);
    ASSERT_TRUE(front_end.ok()) << front_end.status();
    front_end_ = front_end->release();
  }
  static void TearDownTestSuite() {
    delete front_end_;
    if (engine_ != nullptr) engine_->Stop();
    delete engine_;
  }

  static std::unique_ptr<v1::Specd::Stub> Connect(int32_t port) {
    return v1::Specd::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }

  // A stub on a connection of its own (channels otherwise share one), that is, another
  // caller; with a small HTTP/2 window and no BDP probing that would grow it, so a client
  // that stops reading stalls the stream after a few KiB.
  static std::unique_ptr<v1::Specd::Stub> ConnectAlone(int32_t port) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4096);
    return v1::Specd::NewStub(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                                        grpc::InsecureChannelCredentials(), args));
  }

  // Another front end over the engine, on a free port, with these per-stream limits.
  static std::unique_ptr<GrpcFrontEnd> StartLimited(int64_t max_queued_bytes,
                                                    absl::Duration write_timeout) {
    GrpcFrontEndOptions fe;
    fe.host = "127.0.0.1";
    fe.port = 0;
    fe.max_queued_bytes_per_stream = max_queued_bytes;
    fe.write_timeout = write_timeout;
    absl::StatusOr<std::unique_ptr<GrpcFrontEnd>> front_end = GrpcFrontEnd::Start(engine_, fe);
    EXPECT_TRUE(front_end.ok()) << front_end.status();
    return front_end.ok() ? *std::move(front_end) : nullptr;
  }

  static v1::AbortResponse Abort(v1::Specd::Stub& stub, const std::string& request_id) {
    v1::AbortRequest a;
    a.set_request_id(request_id);
    v1::AbortResponse response;
    grpc::ClientContext ctx;
    grpc::Status st = stub.Abort(&ctx, a, &response);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return response;
  }

  // Reads the rest of a stream: its tokens and final status.
  static Stream Drain(grpc::ClientReader<v1::GenerateResponse>& reader) {
    Stream out;
    v1::GenerateResponse msg;
    while (reader.Read(&msg)) {
      out.ids.insert(out.ids.end(), msg.token_ids().begin(), msg.token_ids().end());
      out.messages.push_back(msg);
    }
    out.status = reader.Finish();
    return out;
  }

  // Within ~10 s, the engine reports a paused request.
  static bool EnginePaused() {
    for (int i = 0; i < 1000; ++i) {
      if (engine_->Stats().num_paused > 0) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  static Stream Generate(v1::Specd::Stub& stub, const v1::GenerateRequest& request,
                         grpc::ClientContext* ctx) {
    Stream out;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub.Generate(ctx, request);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      out.ids.insert(out.ids.end(), msg.token_ids().begin(), msg.token_ids().end());
      out.text += msg.text();
      out.messages.push_back(msg);
    }
    out.status = reader->Finish();
    return out;
  }

  // The engine has nothing running or queued and no KV block in use (within ~10 s).
  static bool EngineIdle() {
    for (int i = 0; i < 1000; ++i) {
      EngineStats s = engine_->Stats();
      if (s.num_running == 0 && s.num_waiting == 0 && s.kv_blocks_used == 0) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  static v1::GenerateRequest LongRequest() {
    v1::GenerateRequest r;
    r.set_text("def main(");
    r.set_max_tokens(4000);
    r.set_ignore_eos(true);
    r.set_temperature(0);
    return r;
  }

  static Engine* engine_;
  static GrpcFrontEnd* front_end_;
};

Engine* GrpcFrontEndTest::engine_ = nullptr;
GrpcFrontEnd* GrpcFrontEndTest::front_end_ = nullptr;

TEST_F(GrpcFrontEndTest, GreedyStreamMatchesHfGolden) {
  std::ifstream in(kGolden);
  const nlohmann::json golden = nlohmann::json::parse(in)["target"][0];
  v1::GenerateRequest r;
  for (int id : golden["prompt_ids"]) r.mutable_token_ids()->add_ids(id);
  r.set_max_tokens(48);
  r.set_ignore_eos(true);
  r.set_temperature(0);
  auto stub = Connect(front_end_->port());
  grpc::ClientContext ctx;
  Stream s = Generate(*stub, r, &ctx);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.ids, golden["greedy_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(s.text, golden["greedy_text"].get<std::string>());
  const v1::GenerateResponse& last = s.messages.back();
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.usage().prompt_tokens(), static_cast<int>(golden["prompt_ids"].size()));
  EXPECT_EQ(last.usage().completion_tokens(), 48);
  for (size_t i = 0; i + 1 < s.messages.size(); ++i) {
    EXPECT_EQ(s.messages[i].finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
    EXPECT_FALSE(s.messages[i].request_id().empty());
  }
  EXPECT_TRUE(EngineIdle());
}

TEST_F(GrpcFrontEndTest, ChoicesStreamWithTheirIndexAndLogprobs) {
  v1::GenerateRequest r;
  r.set_text("import os\n");
  r.set_max_tokens(6);
  r.set_ignore_eos(true);
  r.set_n(2);
  r.set_seed(3);
  r.set_logprobs(2);
  auto stub = Connect(front_end_->port());
  grpc::ClientContext ctx;
  Stream s = Generate(*stub, r, &ctx);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  int finals = 0;
  size_t tokens[2] = {0, 0};
  for (const v1::GenerateResponse& m : s.messages) {
    ASSERT_LT(m.index(), 2u);
    tokens[m.index()] += m.token_ids_size();
    ASSERT_EQ(m.logprobs_size(), m.token_ids_size());
    for (int i = 0; i < m.logprobs_size(); ++i) {
      EXPECT_EQ(m.logprobs(i).sampled().token_id(), m.token_ids(i));
      EXPECT_EQ(m.logprobs(i).top_size(), 2);
    }
    finals += m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  }
  EXPECT_EQ(finals, 2);
  EXPECT_EQ(tokens[0], 6u);
  EXPECT_EQ(tokens[1], 6u);
}

TEST_F(GrpcFrontEndTest, BadRequestsAreInvalidArgumentAndTheServerKeepsServing) {
  auto stub = Connect(front_end_->port());
  v1::GenerateRequest r;
  r.set_text("hi");
  r.set_temperature(-2);
  grpc::ClientContext ctx;
  Stream s = Generate(*stub, r, &ctx);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.status.error_message().find("temperature"), std::string::npos);
  EXPECT_TRUE(s.messages.empty());

  v1::GenerateRequest ids;
  ids.mutable_token_ids()->add_ids(999999);
  grpc::ClientContext ctx2;
  s = Generate(*stub, ids, &ctx2);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.status.error_message().find("vocabulary"), std::string::npos);

  v1::DetokenizeRequest d;
  d.add_token_ids(-5);
  v1::DetokenizeResponse dr;
  grpc::ClientContext ctx3;
  EXPECT_EQ(stub->Detokenize(&ctx3, d, &dr).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  v1::GetModelInfoResponse info;
  grpc::ClientContext ctx4;
  ASSERT_TRUE(stub->GetModelInfo(&ctx4, {}, &info).ok());
  EXPECT_EQ(info.served_model_name(), "codepair");
  EXPECT_EQ(info.architecture(), "LlamaForCausalLM");
  EXPECT_EQ(info.vocab_size(), 8192);
  EXPECT_EQ(info.max_model_len(), engine_->max_model_len());
  EXPECT_EQ(info.bos_token_id(), 0);
  EXPECT_TRUE(info.has_tokenizer());
}

TEST_F(GrpcFrontEndTest, TokenizeDetokenizeRoundTrip) {
  auto stub = Connect(front_end_->port());
  v1::TokenizeRequest t;
  t.set_text("for i in range(10):\n    print(i)");
  v1::TokenizeResponse tr;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Tokenize(&ctx, t, &tr).ok());
  EXPECT_EQ(tr.token_ids(0), 0);
  EXPECT_EQ(tr.count(), tr.token_ids_size());
  v1::DetokenizeRequest d;
  *d.mutable_token_ids() = tr.token_ids();
  v1::DetokenizeResponse dr;
  grpc::ClientContext ctx2;
  ASSERT_TRUE(stub->Detokenize(&ctx2, d, &dr).ok());
  EXPECT_EQ(dr.text(), t.text());
}

TEST_F(GrpcFrontEndTest, ClientCancelStopsTheWork) {
  auto stub = Connect(front_end_->port());
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, LongRequest());
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  // Cut by the closing connection (UNAVAILABLE) or by its reactor's cancel, whichever wins.
  EXPECT_THAT(reader->Finish().error_code(),
              ::testing::AnyOf(grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::CANCELLED));
  EXPECT_TRUE(EngineIdle());
}

TEST_F(GrpcFrontEndTest, DeadlineStopsTheWork) {
  auto stub = Connect(front_end_->port());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  Stream s = Generate(*stub, LongRequest(), &ctx);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(EngineIdle());
}

TEST_F(GrpcFrontEndTest, AbortByRequestIdEndsTheStreamCancelled) {
  auto stub = Connect(front_end_->port());
  v1::GenerateRequest r = LongRequest();
  r.set_request_id("abort-me");
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, r);
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  EXPECT_EQ(msg.request_id(), "abort-me");

  v1::GenerateRequest dup = r;
  grpc::ClientContext dup_ctx;
  Stream d = Generate(*stub, dup, &dup_ctx);
  EXPECT_EQ(d.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);

  v1::AbortRequest a;
  a.set_request_id("abort-me");
  v1::AbortResponse ar;
  grpc::ClientContext actx;
  ASSERT_TRUE(stub->Abort(&actx, a, &ar).ok());
  EXPECT_TRUE(ar.found());
  while (reader->Read(&msg)) {
  }
  grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << st.error_message();
  EXPECT_TRUE(EngineIdle());

  grpc::ClientContext actx2;
  ASSERT_TRUE(stub->Abort(&actx2, a, &ar).ok());
  EXPECT_FALSE(ar.found());
}

TEST_F(GrpcFrontEndTest, AbortAndRequestIdsAreScopedToTheCallersConnection) {
  auto alice = ConnectAlone(front_end_->port());
  auto bob = ConnectAlone(front_end_->port());
  v1::GenerateRequest r = LongRequest();
  r.set_request_id("job-1");
  grpc::ClientContext alice_ctx;
  auto alice_reader = alice->Generate(&alice_ctx, r);
  v1::GenerateResponse msg;
  ASSERT_TRUE(alice_reader->Read(&msg));

  // Bob cannot abort Alice's job-1: to him it does not exist...
  EXPECT_FALSE(Abort(*bob, "job-1").found());
  // ...so his own job-1 is no conflict, and aborting it ends only his.
  grpc::ClientContext bob_ctx;
  auto bob_reader = bob->Generate(&bob_ctx, r);
  ASSERT_TRUE(bob_reader->Read(&msg));
  EXPECT_EQ(msg.request_id(), "job-1");
  EXPECT_TRUE(Abort(*bob, "job-1").found());
  EXPECT_EQ(Drain(*bob_reader).status.error_code(), grpc::StatusCode::CANCELLED);

  // Alice's call still runs, and a second live job-1 of hers is refused.
  grpc::ClientContext dup_ctx;
  EXPECT_EQ(Generate(*alice, r, &dup_ctx).status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_TRUE(Abort(*alice, "job-1").found());
  Stream rest = Drain(*alice_reader);
  EXPECT_EQ(rest.status.error_code(), grpc::StatusCode::CANCELLED) << rest.status.error_message();
  EXPECT_TRUE(EngineIdle());
}

TEST_F(GrpcFrontEndTest, ServerAssignedRequestIdsAreRandomAndPrivate) {
  auto alice = ConnectAlone(front_end_->port());
  auto bob = ConnectAlone(front_end_->port());
  grpc::ClientContext ctx1, ctx2;
  auto first = alice->Generate(&ctx1, LongRequest());
  auto second = alice->Generate(&ctx2, LongRequest());
  v1::GenerateResponse m1, m2;
  ASSERT_TRUE(first->Read(&m1));
  ASSERT_TRUE(second->Read(&m2));
  for (const std::string& id : {m1.request_id(), m2.request_id()}) {
    EXPECT_THAT(id, ::testing::MatchesRegex("grpc-[0-9a-f]{32}"));
  }
  EXPECT_NE(m1.request_id(), m2.request_id());
  EXPECT_FALSE(Abort(*bob, m1.request_id()).found());
  EXPECT_TRUE(Abort(*alice, m1.request_id()).found());
  EXPECT_TRUE(Abort(*alice, m2.request_id()).found());
  EXPECT_EQ(Drain(*first).status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(Drain(*second).status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(EngineIdle());
}

// Backpressure: past the queued-bytes cap the engine pauses the choices; with no write
// completed for the write timeout, they are aborted (KV freed) and the stream cancelled.
TEST_F(GrpcFrontEndTest, AStreamWhoseClientStopsReadingIsPausedThenAborted) {
  std::unique_ptr<GrpcFrontEnd> limited = StartLimited(64 << 10, absl::Seconds(2));
  ASSERT_NE(limited, nullptr);
  auto stub = ConnectAlone(limited->port());
  v1::GenerateRequest r = LongRequest();
  r.set_n(8);
  r.set_logprobs(20);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, r);  // and read nothing
  EXPECT_TRUE(EnginePaused());
  const absl::Time paused = absl::Now();
  EXPECT_TRUE(EngineIdle());
  EXPECT_GE(absl::Now() - paused, absl::Seconds(1));  // not before (most of) the timeout
  Stream s = Drain(*reader);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::CANCELLED) << s.status.error_message();
  EXPECT_LT(s.ids.size(), 8u * 4000u / 4);
}

// A client that pauses reading for less than the write timeout gets every token, exactly
// those of an uninterrupted stream.
TEST_F(GrpcFrontEndTest, AStreamPausedForASlowClientResumesLosslessly) {
  std::unique_ptr<GrpcFrontEnd> limited = StartLimited(8 << 10, absl::Seconds(60));
  ASSERT_NE(limited, nullptr);
  auto stub = ConnectAlone(limited->port());
  v1::GenerateRequest r = LongRequest();
  r.set_max_tokens(100);
  r.set_n(4);
  r.set_temperature(0.8f);
  r.set_seed(7);
  r.set_logprobs(20);
  auto per_choice = [](const Stream& s) {
    std::vector<std::vector<int32_t>> ids(4);
    for (const v1::GenerateResponse& m : s.messages) {
      ids.at(m.index()).insert(ids[m.index()].end(), m.token_ids().begin(), m.token_ids().end());
    }
    return ids;
  };
  grpc::ClientContext want_ctx;
  Stream want = Generate(*Connect(front_end_->port()), r, &want_ctx);
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();

  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, r);
  EXPECT_TRUE(EnginePaused());
  absl::SleepFor(absl::Milliseconds(300));
  Stream got = Drain(*reader);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(per_choice(got), per_choice(want));
  EXPECT_EQ(got.ids.size(), 4u * 100u);
  EXPECT_TRUE(EngineIdle());
}

TEST_F(GrpcFrontEndTest, ConcurrentStreamsWithCancelsLoseNoTokens) {
  auto stub = Connect(front_end_->port());
  auto request = [](int i) {
    v1::GenerateRequest r;
    r.set_text(absl::StrCat("def func_", i, "(a, b):"));
    r.set_max_tokens(24);
    r.set_ignore_eos(true);
    r.set_temperature(0);
    return r;
  };
  constexpr int kStreams = 24;
  std::vector<Stream> alone(kStreams / 3);
  for (int i = 0; i < kStreams / 3; ++i) {
    grpc::ClientContext ctx;
    alone[i] = Generate(*stub, request(i), &ctx);
    ASSERT_TRUE(alone[i].status.ok());
  }
  std::vector<Stream> together(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      grpc::ClientContext ctx;
      if (i % 3 != 0) {  // every third runs to the end; the others are cancelled early
        auto reader = stub->Generate(&ctx, request(i % (kStreams / 3)));
        v1::GenerateResponse msg;
        for (int n = 0; n < i % 4 && reader->Read(&msg);) n += msg.token_ids_size();
        ctx.TryCancel();
        while (reader->Read(&msg)) {
        }
        together[i].status = reader->Finish();
        return;
      }
      together[i] = Generate(*stub, request(i % (kStreams / 3)), &ctx);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kStreams; i += 3) {
    ASSERT_TRUE(together[i].status.ok()) << together[i].status.error_message();
    EXPECT_EQ(together[i].ids, alone[i % (kStreams / 3)].ids) << i;
    EXPECT_EQ(together[i].text, alone[i % (kStreams / 3)].text) << i;
  }
  EXPECT_TRUE(EngineIdle());
}

TEST_F(GrpcFrontEndTest, ApiKeyGuardsEveryCall) {
  GrpcFrontEndOptions fe;
  fe.host = "127.0.0.1";
  fe.port = 0;
  fe.api_key = "s3cret";
  absl::StatusOr<std::unique_ptr<GrpcFrontEnd>> secured = GrpcFrontEnd::Start(engine_, fe);
  ASSERT_TRUE(secured.ok()) << secured.status();
  auto stub = Connect((*secured)->port());
  for (const char* auth : {"", "Bearer wrong", "Bearer s3cret"}) {
    grpc::ClientContext ctx;
    if (*auth) ctx.AddMetadata("authorization", auth);
    v1::GetServerInfoResponse info;
    grpc::Status st = stub->GetServerInfo(&ctx, {}, &info);
    if (std::string(auth) == "Bearer s3cret") {
      EXPECT_TRUE(st.ok()) << st.error_message();
      EXPECT_EQ(info.kv_blocks_used(), 0);
      EXPECT_GT(info.kv_blocks_total(), 0);
    } else {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << auth;
    }
  }
  grpc::ClientContext ctx;
  v1::GenerateRequest r;
  r.set_text("x");
  Stream s = Generate(*stub, r, &ctx);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(GrpcFrontEndTest, ShutdownCancelsStreamsPastTheDeadline) {
  GrpcFrontEndOptions fe;
  fe.host = "127.0.0.1";
  fe.port = 0;
  absl::StatusOr<std::unique_ptr<GrpcFrontEnd>> second = GrpcFrontEnd::Start(engine_, fe);
  ASSERT_TRUE(second.ok()) << second.status();
  auto stub = Connect((*second)->port());
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, LongRequest());
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  const absl::Time start = absl::Now();
  std::thread shutdown([&] { (*second)->Shutdown(absl::Now() + absl::Milliseconds(600)); });
  absl::SleepFor(absl::Milliseconds(200));
  {  // while the stream may still finish, new calls are refused
    grpc::ClientContext info_ctx;
    v1::GetServerInfoResponse info;
    grpc::Status st = stub->GetServerInfo(&info_ctx, {}, &info);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  }
  shutdown.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  while (reader->Read(&msg)) {
  }
  // Cut by the closing connection (UNAVAILABLE) or by its reactor's cancel, whichever wins.
  EXPECT_THAT(reader->Finish().error_code(),
              ::testing::AnyOf(grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::CANCELLED));
  EXPECT_TRUE(EngineIdle());
}

TEST_F(GrpcFrontEndTest, ShutdownWithIdleClientIsQuick) {
  GrpcFrontEndOptions fe;
  fe.host = "127.0.0.1";
  fe.port = 0;
  absl::StatusOr<std::unique_ptr<GrpcFrontEnd>> second = GrpcFrontEnd::Start(engine_, fe);
  ASSERT_TRUE(second.ok()) << second.status();
  auto stub = Connect((*second)->port());
  grpc::ClientContext ctx;
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(stub->GetServerInfo(&ctx, {}, &info).ok());
  const absl::Time start = absl::Now();
  (*second)->Shutdown(absl::Now() + absl::Seconds(3));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

}  // namespace
}  // namespace specd
