// libFuzzer target: a safetensors file (engine/model/safetensors), as a model directory from an
// untrusted source would hold it. Open must refuse bad headers with a status (safetensors.h:
// "never a crash or an out-of-bounds read"); every tensor of a file that opens is then read
// back as f32 where its dtype allows.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace specd::fuzz {
namespace {

// Tensors larger than this are only looked up, not converted (keeps each input fast).
constexpr int64_t kMaxReadElements = int64_t{1} << 16;

void ReadTensors(const SafetensorsCheckpoint& checkpoint, const SafetensorsFile& file) {
  for (const auto& [name, info] : file.tensors()) {
    FUZZ_CHECK(checkpoint.Find(name) != nullptr, name);
    int64_t elements = 1;
    for (int64_t d : info.shape)
      elements = d > 0 && elements <= kMaxReadElements ? elements * d : 0;
    if (elements == 0 || elements > kMaxReadElements) continue;
    absl::StatusOr<std::vector<float>> values = checkpoint.ReadF32(name, info.shape);
    if (values.ok()) FUZZ_CHECK(values->size() == static_cast<size_t>(elements), name);
  }
}

void FuzzOne(const uint8_t* data, size_t size) {
  static ScratchFile file;
  QuietLogs();
  file.Write(data, size);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> opened = SafetensorsFile::Open(file.path());
  absl::StatusOr<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::OpenFile(file.path());
  FUZZ_CHECK(opened.ok() == checkpoint.ok(), "Open and OpenFile disagree");
  if (opened.ok()) ReadTensors(*checkpoint, **opened);
}

}  // namespace
}  // namespace specd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specd::fuzz::FuzzOne(data, size);
  return 0;
}
