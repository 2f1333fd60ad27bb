// capture.cu: a CUDA graph captured (global mode, the default) on the main
// thread while another thread gives memory back: it frees malloc'd buffers
// and munmaps mmap'd ones that it registered, copied and unregistered before
// the capture began. Without lazypin nothing calls CUDA during the capture;
// with lazypin those buffers are pooled and leave through lazypin's own
// unregisters (the collector's for free, munmap's hook for munmap), which must
// neither be refused nor invalidate the capture. The simulated driver models
// capture as measured (tests/simcuda/README.md).
//
// CLI: capture [--buffers 8] [--bytes 1M] [--probe sync|unregister] [--relaxed] [--count-unregisters]
// Prints every code and the graph's result; the output must not change with lazypin.
// --probe: the releasing thread itself calls cudaDeviceSynchronize or
// cudaHostUnregister (of a buffer registered before the capture) during the
// capture, in relaxed capture mode with --relaxed: what the driver allows
// there, i.e. what lazypin may do while a capture is in progress.
// --count-unregisters (simulated driver only): prints how many unregisters
// the driver made during the capture and by 2 s after its end, so a test can
// see when lazypin released the pooled memory.
#include <dlfcn.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "common.h"

namespace {

const char* kUsage =
    "usage: capture [--buffers 8] [--bytes 1M] [--probe sync|unregister] [--relaxed] "
    "[--count-unregisters]\n";

// The simulated driver's count of successful unregisters; null elsewhere.
unsigned long (*SimUnregisterCalls())() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return h ? reinterpret_cast<unsigned long (*)()>(dlsym(h, "simcuda_unregister_calls")) : nullptr;
}

__global__ void add_one(int* counter) { atomicAdd(counter, 1); }

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"buffers", "bytes", "probe"}, {"relaxed", "count-unregisters"}, kUsage);

  const std::string probe = args.str("probe", "");
  const bool relaxed = args.has("relaxed");
  const int n = static_cast<int>(args.real("buffers", 8));
  const size_t bytes = args.size("bytes", 1 << 20);

  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  auto unregisters = args.has("count-unregisters") ? SimUnregisterCalls() : nullptr;
  if (args.has("count-unregisters") && unregisters == nullptr) {
    std::fprintf(stderr, "capture: --count-unregisters needs the simulated driver\n");
    return 2;
  }
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* counter = nullptr;
  void* dev = nullptr;
  CHECK(cudaMalloc(&counter, sizeof(int)));
  CHECK(cudaMemset(counter, 0, sizeof(int)));
  CHECK(cudaMalloc(&dev, bytes));

  // Registered, used and unregistered before the capture (pooled under lazypin).
  std::vector<void*> heap, mapped;
  for (int i = 0; i < n; ++i) {
    heap.push_back(tapp::alloc_aligned(bytes));
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    mapped.push_back(m);
  }
  for (void* p : heap) {
    std::printf("heap register=%d", cudaHostRegister(p, bytes, 0));
    std::printf(" copy=%d", cudaMemcpy(dev, p, bytes, cudaMemcpyHostToDevice));
    std::printf(" unregister=%d\n", cudaHostUnregister(p));
  }
  for (void* p : mapped) {
    std::printf("mmap register=%d", cudaHostRegister(p, bytes, 0));
    std::printf(" copy=%d", cudaMemcpy(dev, p, bytes, cudaMemcpyHostToDevice));
    std::printf(" unregister=%d\n", cudaHostUnregister(p));
  }
  void* kept = tapp::alloc_aligned(bytes);
  if (probe == "unregister") CHECK(cudaHostRegister(kept, bytes, 0));
  CHECK(cudaDeviceSynchronize());

  const unsigned long before = unregisters ? unregisters() : 0;
  std::printf("begin capture=%d\n", cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  add_one<<<1, 1, 0, s>>>(counter);
  std::printf("launch 1=%d\n", cudaGetLastError());
  std::thread releaser([&] {
    if (!probe.empty()) {
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      if (relaxed) std::printf("probe exchange mode=%d\n", cudaThreadExchangeStreamCaptureMode(&mode));
      if (probe == "sync") std::printf("probe sync=%d\n", cudaDeviceSynchronize());
      if (probe == "unregister") std::printf("probe unregister=%d\n", cudaHostUnregister(kept));
      cudaGetLastError();
    }
    for (void* p : heap) std::free(p);
    for (void* p : mapped) munmap(p, bytes);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // lazypin's collector runs
  });
  releaser.join();
  add_one<<<1, 1, 0, s>>>(counter);
  std::printf("launch 2=%d\n", cudaGetLastError());
  const unsigned long during = unregisters ? unregisters() - before : 0;
  cudaGraph_t graph = nullptr;
  std::printf("end capture=%d\n", cudaStreamEndCapture(s, &graph));
  if (unregisters) {
    const unsigned long want = 2ul * static_cast<unsigned long>(n);
    for (int i = 0; i < 200 && unregisters() - before < want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::printf("unregisters during capture=%lu by 2 s after its end=%lu\n", during,
                unregisters() - before);
  }
  cudaGraphExec_t exec = nullptr;
  const int inst = graph ? cudaGraphInstantiate(&exec, graph, 0) : -1;
  std::printf("instantiate=%d\n", inst);
  if (inst == 0) {
    std::printf("graph launch=%d\n", cudaGraphLaunch(exec, s));
    std::printf("sync=%d\n", cudaStreamSynchronize(s));
  }
  int value = -1;
  std::printf("copy back=%d", cudaMemcpy(&value, counter, sizeof(int), cudaMemcpyDeviceToHost));
  std::printf(" counter=%d\n", value);
  std::printf("last error=%d\n", cudaGetLastError());
  std::printf("CAPTURE %s\n", value == 2 ? "ok" : "FAILED");
  return value == 2 ? 0 : 4;
}
