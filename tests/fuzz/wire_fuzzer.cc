// libFuzzer target: the dist/ wire decoder (engine/distributed/messages.h) on frames from a peer,
// as the verifier and the speculator read them off their TCP link. Input: a control byte, then one
// frame. With control bit 0 the target reseals the frame (payload length and CRC-32C made to match,
// distributed_test::Reseal), so the fuzzer reaches the payload decoders instead of stopping at the
// checksum. Checks: bad bytes are a status; a decoded message re-encodes, and encoding is stable
// (decode(encode(m)) encodes to the same bytes).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/distributed/distributed_test_util.h"
#include "engine/distributed/messages.h"
#include "tests/fuzz/fuzz_util.h"

namespace specd::fuzz {
namespace {

// With SPECD_FUZZ_WRITE_SEEDS=<dir>: writes the seed corpus (control byte 1, then a real frame
// of each message type, distributed_test::AllSampleMessages) into <dir>; corpus/wire comes from
// here.
void WriteSeeds(const char* dir) {
  const WireLimits limits = distributed_test::TestLimits();
  uint64_t sequence = 0;
  for (const Message& message : distributed_test::AllSampleMessages()) {
    std::vector<uint8_t> frame = distributed_test::Encode(message, sequence++, limits);
    FUZZ_CHECK(!frame.empty(), std::string(MessageTypeName(TypeOf(message))));
    frame.insert(frame.begin(), uint8_t{1});
    ScratchDir::WriteFileAt(std::string(dir) + "/" + std::string(MessageTypeName(TypeOf(message))),
                            {reinterpret_cast<const char*>(frame.data()), frame.size()});
  }
}

void FuzzOne(const uint8_t* data, size_t size) {
  if (size == 0) return;
  static const WireLimits limits = distributed_test::TestLimits();
  std::vector<uint8_t> frame(data + 1, data + size);
  if ((data[0] & 1) && frame.size() >= kFrameHeaderBytes) distributed_test::Reseal(&frame);
  (void)DecodeFrameHeader(frame, limits);
  Message message;
  absl::StatusOr<FrameHeader> header = DecodeFrame(frame, limits, &message);
  if (!header.ok()) return;
  const std::vector<uint8_t> first = distributed_test::Encode(message, header->sequence, limits);
  if (first.empty()) return;  // e.g. a version-1 Hello, which only a peer may still send
  Message again;
  absl::StatusOr<FrameHeader> header2 = DecodeFrame(first, limits, &again);
  FUZZ_CHECK(header2.ok(), header2.status().ToString());
  FUZZ_CHECK(distributed_test::Encode(again, header2->sequence, limits) == first,
             "encoding is not stable");
}

}  // namespace
}  // namespace specd::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("SPECD_FUZZ_WRITE_SEEDS")) specd::fuzz::WriteSeeds(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specd::fuzz::FuzzOne(data, size);
  return 0;
}
