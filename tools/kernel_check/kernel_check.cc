// kernel_check: every CUDA op x shape of the op table (kernels/check/op_table.h).
//   kernel_check --mode check [--op NAME]  outputs vs the fp64 reference (flash-attention rule)
//   kernel_check --mode perf  [--op NAME]  time per launch (CUDA events) and GB/s, against a
//                                          device-to-device cudaMemcpy timed in the same run
//   --shape TEXT: only the shapes whose printed form contains TEXT (one row under a profiler)
// Exit status: 0 when every check passed (perf always 0 unless CUDA fails), 1 on a failed check,
// 2 on bad arguments, 77 when no GPU is visible.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "kernels/check/cuda_check.h"
#include "kernels/check/op_table.h"

namespace specd::kernels::check {
namespace {

struct Options {
  std::string mode;
  std::string op;     // empty: every op
  std::string shape;  // empty: every shape; else a substring of OpShape::ToString()
};

bool ParseArgs(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--mode" || arg == "--op" || arg == "--shape") && i + 1 < argc) {
      (arg == "--mode" ? options->mode : arg == "--op" ? options->op : options->shape) = argv[++i];
    } else {
      return false;
    }
  }
  return options->mode == "check" || options->mode == "perf";
}

bool Selected(const Options& options, const OpSpec& op) {
  return options.op.empty() || options.op == op.name;
}
bool Selected(const Options& options, const OpShape& shape) {
  return options.shape.empty() || shape.ToString().find(options.shape) != std::string::npos;
}

int RunCheck(const Options& options) {
  int num_failed = 0, num_checks = 0;
  std::printf("%-20s %-22s %-9s %12s %12s %12s  %s\n", "op", "shape", "output", "max_err",
              "baseline", "tolerance", "result");
  for (const OpSpec& op : OpTable()) {
    if (!Selected(options, op)) continue;
    for (const OpShape& shape : op.check_shapes) {
      if (!Selected(options, shape)) continue;
      for (const ErrorCheck& e : op.make(shape)->Check()) {
        ++num_checks;
        num_failed += e.passed ? 0 : 1;
        std::printf("%-20s %-22s %-9s %12.4e %12.4e %12.4e  %s\n", op.name.c_str(),
                    shape.ToString().c_str(), e.output.c_str(), e.kernel_error, e.baseline_error,
                    e.tolerance, e.passed ? "ok" : "FAIL");
      }
    }
  }
  std::printf("check: %d/%d outputs within tolerance\n", num_checks - num_failed, num_checks);
  return num_checks > 0 && num_failed == 0 ? 0 : 1;
}

// Mean milliseconds per launch over enough launches to fill ~20 ms, after warm-up.
double TimeLaunchMs(const std::function<cudaError_t(cudaStream_t)>& launch, cudaStream_t stream) {
  cudaEvent_t start, stop;
  SPECD_CUDA_CHECK(cudaEventCreate(&start));
  SPECD_CUDA_CHECK(cudaEventCreate(&stop));
  auto time_launches = [&](int n) {
    SPECD_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < n; ++i) SPECD_CUDA_CHECK(launch(stream));
    SPECD_CUDA_CHECK(cudaEventRecord(stop, stream));
    SPECD_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    SPECD_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) / n;
  };
  const double first = time_launches(3);  // warm-up, and a first estimate
  int n = static_cast<int>(20.0 / std::max(first, 1e-3));
  n = std::max(10, std::min(n, 2000));
  const double ms = time_launches(n);
  SPECD_CUDA_CHECK(cudaEventDestroy(start));
  SPECD_CUDA_CHECK(cudaEventDestroy(stop));
  return ms;
}

// Device-to-device copy bandwidth (bytes read + written per second) on 256 MiB, far past L2.
double MemcpyGbPerS(cudaStream_t stream) {
  const size_t bytes = size_t{256} << 20;
  DeviceBuffer src(bytes), dst(bytes);
  SPECD_CUDA_CHECK(cudaMemset(src.as<void>(), 0x3c, bytes));  // bf16 1.1719: not zeros
  const double ms = TimeLaunchMs(
      [&](cudaStream_t s) {
        return cudaMemcpyAsync(dst.as<void>(), src.as<void>(), bytes, cudaMemcpyDeviceToDevice, s);
      },
      stream);
  return 2.0 * bytes / (ms * 1e6);
}

int RunPerf(const Options& options) {
  cudaStream_t stream;
  SPECD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double memcpy_gbps = MemcpyGbPerS(stream);
  std::printf("%-20s %-22s %10s %10s %9s\n", "op", "shape", "us/launch", "GB/s", "%memcpy");
  for (const OpSpec& op : OpTable()) {
    if (!Selected(options, op)) continue;
    for (const OpShape& shape : op.perf_shapes) {
      if (!Selected(options, shape)) continue;
      auto op_case = op.make(shape);
      const double ms = TimeLaunchMs([&](cudaStream_t s) { return op_case->Launch(s); }, stream);
      const double gbps = op_case->BytesMoved() / (ms * 1e6);
      std::printf("%-20s %-22s %10.2f %10.1f %8.1f%%\n", op.name.c_str(), shape.ToString().c_str(),
                  ms * 1e3, gbps, 100.0 * gbps / memcpy_gbps);
    }
  }
  std::printf("memcpy D2D 256 MiB: %.1f GB/s (bytes read + written, as for every row)\n",
              memcpy_gbps);
  SPECD_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

int Main(int argc, char** argv) {
  Options options;
  if (!ParseArgs(argc, argv, &options)) {
    std::fprintf(stderr, "usage: kernel_check --mode check|perf [--op NAME] [--shape TEXT]\nops:");
    for (const OpSpec& op : OpTable()) std::fprintf(stderr, " %s", op.name.c_str());
    std::fprintf(stderr, "\n");
    return 2;
  }
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "kernel_check: no CUDA device visible\n");
    return kSkipExitCode;
  }
  cudaDeviceProp prop;
  SPECD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device 0: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  return options.mode == "check" ? RunCheck(options) : RunPerf(options);
}

}  // namespace
}  // namespace specd::kernels::check

int main(int argc, char** argv) { return specd::kernels::check::Main(argc, argv); }
