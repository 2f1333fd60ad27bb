// graphcopy.cu: a CUDA graph replaying copies of memory the program believes
// pageable. A graph holds a host-to-device copy from `src` and a
// device-to-host copy into `dst` (made by stream capture, or by explicit
// memcpy nodes); it is launched behind a kernel, and `src` is overwritten
// right after cudaGraphLaunch returns. Per launch the program prints what the
// device got and whether `dst` was complete when the launch returned:
//   graph <build> <memory> launch <i>: h2d <launch|after|mixed>, d2h <complete|pending>
// (launch: the bytes as of the launch; after: those written after it).
// --memory says what `src` and `dst` are before each launch:
//   pageable      plain memory nobody registered;
//   unregistered  registered, copied, unregistered again before every launch
//                 (under lazypin --defer the pool still holds the registration);
//   copied        copied once with cudaMemcpy before every launch (under
//                 LAZYPIN_AUTOPIN=1 that pins it behind the program's back).
// The output must be the same bare and under lazypin in every mode; on the
// simulated stack run it with SIMCUDA_KERNEL_US set (the kernel must be
// running when the graph is launched).
//
// CLI: graphcopy [--size 8M] [--launches 3] [--spin-ms 50]
//                [--build capture|explicit] [--memory pageable|unregistered|copied]
// Exit: 0 (whatever it printed); 1 on a CUDA error.
#include "common.h"

#include <cuda_runtime.h>

#include <string>

namespace {

const char* kUsage =
    "usage: graphcopy [--size 8M] [--launches 3] [--spin-ms 50] [--build capture|explicit]\n"
    "                 [--memory pageable|unregistered|copied]\n";

__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

const char* Classify(const unsigned char* got, const unsigned char* at_launch, unsigned char after,
                     size_t n) {
  if (tapp::first_diff(got, at_launch, n) < 0) return "launch";
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != after) return "mixed";
  }
  return "after";
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"size", "launches", "spin-ms", "build", "memory"}, {}, kUsage);
  const size_t n = (args.size("size", 8 << 20) + tapp::kPage - 1) & ~(tapp::kPage - 1);
  const int launches = static_cast<int>(args.size("launches", 3));
  const long long spin_cycles = static_cast<long long>(args.size("spin-ms", 50)) * 2000000;  // ~2 GHz
  const std::string build = args.str("build", "capture");
  const std::string memory = args.str("memory", "pageable");
  if ((build != "capture" && build != "explicit") ||
      (memory != "pageable" && memory != "unregistered" && memory != "copied")) {
    std::fputs(kUsage, stderr);
    return 1;
  }
  auto* src = static_cast<unsigned char*>(tapp::alloc_aligned(n));
  auto* dst = static_cast<unsigned char*>(tapp::alloc_aligned(n));
  auto* at_launch = static_cast<unsigned char*>(tapp::alloc_aligned(n));
  auto* check = static_cast<unsigned char*>(tapp::alloc_aligned(n));
  std::memset(src, 0, n);
  std::memset(dst, 0, n);
  void *d_in = nullptr, *d_out = nullptr;
  CHECK(cudaMalloc(&d_in, n));
  CHECK(cudaMalloc(&d_out, n));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  if (memory == "unregistered") {
    // What the graph is made of: memory the program registered once and gave up.
    for (unsigned char* p : {src, dst}) {
      CHECK(cudaHostRegister(p, n, cudaHostRegisterDefault));
      CHECK(cudaHostUnregister(p));
    }
  } else if (memory == "copied") {
    CHECK(cudaMemcpy(d_in, src, n, cudaMemcpyHostToDevice));
  }
  // A driver that refuses such a graph refuses it with and without lazypin:
  // say so and stop (the output is compared).
  cudaGraph_t graph = nullptr;
  cudaError_t made = cudaSuccess;
  if (build == "capture") {
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    made = cudaMemcpyAsync(d_in, src, n, cudaMemcpyHostToDevice, stream);
    if (made == cudaSuccess) made = cudaMemcpyAsync(dst, d_out, n, cudaMemcpyDeviceToHost, stream);
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (made == cudaSuccess) made = ended;
  } else {
    CHECK(cudaGraphCreate(&graph, 0));
    cudaGraphNode_t h2d, d2h;
    made = cudaGraphAddMemcpyNode1D(&h2d, graph, nullptr, 0, d_in, src, n, cudaMemcpyHostToDevice);
    if (made == cudaSuccess) {
      made = cudaGraphAddMemcpyNode1D(&d2h, graph, &h2d, 1, dst, d_out, n, cudaMemcpyDeviceToHost);
    }
  }
  cudaGraphExec_t exec;
  if (made == cudaSuccess) made = cudaGraphInstantiate(&exec, graph, 0);
  if (made != cudaSuccess) {
    std::printf("graph %s %s: refused (%s)\nGRAPHCOPY done\n", build.c_str(), memory.c_str(),
                cudaGetErrorName(made));
    return 0;
  }

  for (int i = 1; i <= launches; ++i) {
    tapp::fill_full(src, n, 10 + i);
    std::memset(dst, 0, n);
    tapp::fill_full(check, n, 100 + i);
    CHECK(cudaMemcpy(d_out, check, n, cudaMemcpyHostToDevice));  // what d2h should bring
    if (memory == "unregistered") {
      for (unsigned char* p : {src, dst}) {
        CHECK(cudaHostRegister(p, n, cudaHostRegisterDefault));
        CHECK(cudaMemcpy(d_in, p, n, cudaMemcpyHostToDevice));
        CHECK(cudaHostUnregister(p));
      }
    } else if (memory == "copied") {
      CHECK(cudaMemcpy(d_in, src, n, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(dst, d_in, n, cudaMemcpyDeviceToHost));
      std::memset(dst, 0, n);
    }
    std::memcpy(at_launch, src, n);
    spin<<<1, 1, 0, stream>>>(spin_cycles);
    CHECK_LAUNCH();
    CHECK(cudaGraphLaunch(exec, stream));
    std::memset(src, 0xEE, n);  // right after the launch returned
    const bool d2h_done = tapp::first_diff(dst, check, n) < 0;
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(check, d_in, n, cudaMemcpyDeviceToHost));
    std::printf("graph %s %s launch %d: h2d %s, d2h %s\n", build.c_str(), memory.c_str(), i,
                Classify(check, at_launch, 0xEE, n), d2h_done ? "complete" : "pending");
    std::fflush(stdout);
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(d_in));
  CHECK(cudaFree(d_out));
  std::printf("GRAPHCOPY done\n");
  return 0;
}
