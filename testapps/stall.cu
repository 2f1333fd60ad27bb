// stall.cu: does cudaHostUnregister wait for unrelated GPU work, and does it
// stall other threads' copies? GPU-ONLY MEANINGFUL: on the simulator kernels do
// not run, so the numbers there mean nothing (the program still runs and exits 0).
//
// Scenario, three phases, each with a spin kernel of --kernel-ms (clock64 loop,
// cycles from cudaDevAttrClockRate in kHz) on non-blocking stream S1, launched
// by thread A, and thread B timing 64 KiB cudaMemcpyAsync H2D +
// cudaStreamSynchronize from a pinned (cudaMallocHost) buffer on non-blocking
// stream S2, in a loop, for 2 x --kernel-ms:
//   baseline    A does nothing else (B's copies with no unregister)
//   unregister  A times cudaHostUnregister of 8 buffers of 4 MiB, registered
//               before the kernel was launched, one after another (the
//               first one's time and the median)
//   register    A times cudaHostRegister of another 4 MiB buffer while the
//               kernel runs (the brief: register does not wait for the kernel)
//   free        A times free() of a third 4 MiB buffer, registered and
//               unregistered before the kernel (so lazypin pools it): under
//               lazypin the pooled registration must go before the memory
//               does, and that unregister must not stall the program's free
// A waits --delay-ms (default 20) after the launch before its call so that the
// kernel is surely running.
//
// CLI: stall [--kernel-ms 200] [--delay-ms 20] [--copy-bytes 64K] [--reg-bytes 4M] [--quick]
//             [--phases baseline,unregister,register,free,idle,evict]
//   --quick  kernel 20 ms (the simulator returns at once anyway)
// Prints per phase one line "phase=<name> worst_copy_us=<n> release_us=<n>"
// (release_us: A's call, 0 in the phases where A makes none; lazypin's own
// release time is in its log's evict record);
// Prints per phase: the call's latency, B's worst / median copy, the number of
// copies, the kernel's measured time (events); then one line
//   RESULT app=stall kernel_ms=<measured> unreg_us= unreg_median_us= reg_us= worst_copy_us=
//          median_copy_us= worst_copy_baseline_us= median_copy_baseline_us=
//          worst_copy_reg_us= copies= copies_baseline= free_us= worst_copy_free_us=
// (fields of phases not run are 0).
#include "common.h"

#include <cuda_runtime.h>

#include <atomic>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

const char* kUsage =
    "usage: stall [--kernel-ms 200] [--delay-ms 20] [--copy-bytes 64K] [--reg-bytes 4M] [--quick]\n"
    "             [--phases baseline,unregister,register,free,idle,evict]\n";

__global__ void spin_kernel(long long cycles, int* out) {
  long long start = clock64();
  long long now = start;
  while (now - start < cycles) now = clock64();
  if (out) *out = static_cast<int>(now - start);
}

constexpr int kUnregisters = 8;  // buffers the unregister phase releases

struct PhaseResult {
  double call_us = 0;  // the (first) call's
  double median_call_us = 0;
  tapp::Stats copies;
  float kernel_ms = 0;
};

// B: copies on its own stream until `stop` (absolute time) passes.
void copier(cudaStream_t s, void* dev, void* pinned, size_t bytes, std::atomic<int>* go,
            double duration_us, std::vector<double>* out) {
  while (go->load() == 0) {
  }
  double end = tapp::now_us() + duration_us;
  while (tapp::now_us() < end) {
    double t0 = tapp::now_us();
    CHECK(cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, s));
    CHECK(cudaStreamSynchronize(s));
    out->push_back(tapp::now_us() - t0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"kernel-ms", "delay-ms", "copy-bytes", "reg-bytes", "phases"},
                  {"quick"}, kUsage);
  static const char* names[] = {"baseline", "unregister", "register", "free", "idle", "evict"};
  bool run_phase[6] = {};
  {
    std::stringstream list(args.str("phases", "baseline,unregister,register,free,idle,evict"));
    std::string name;
    while (std::getline(list, name, ',')) {
      bool known = false;
      for (int i = 0; i < 6; ++i) {
        if (name == names[i]) run_phase[i] = known = true;
      }
      if (!known) {
        std::fprintf(stderr, "stall: unknown phase %s\n%s", name.c_str(), kUsage);
        return 2;
      }
    }
  }
  const bool quick = args.has("quick");
  const double kernel_ms = args.real("kernel-ms", quick ? 20 : 200);
  const double delay_ms = args.real("delay-ms", quick ? 2 : 20);
  const size_t copy_bytes = args.size("copy-bytes", 64 << 10);
  const size_t reg_bytes = args.size("reg-bytes", 4 << 20);

  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  if (clock_khz <= 0) clock_khz = 1000000;  // 1 GHz if the attribute says nothing
  const long long cycles = static_cast<long long>(kernel_ms * static_cast<double>(clock_khz));

  cudaStream_t s_kernel, s_copy;
  CHECK(cudaStreamCreateWithFlags(&s_kernel, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s_copy, cudaStreamNonBlocking));
  cudaEvent_t k0, k1;
  CHECK(cudaEventCreate(&k0));
  CHECK(cudaEventCreate(&k1));

  void *pinned = nullptr, *dev_copy = nullptr, *dev_out = nullptr;
  CHECK(cudaMallocHost(&pinned, copy_bytes));
  std::memset(pinned, 7, copy_bytes);
  CHECK(cudaMalloc(&dev_copy, copy_bytes));
  CHECK(cudaMalloc(&dev_out, sizeof(int)));
  void* reg_a[kUnregisters];
  for (void*& p : reg_a) {
    p = tapp::alloc_aligned(reg_bytes);
    std::memset(p, 1, reg_bytes);
  }
  void* reg_b = tapp::alloc_aligned(reg_bytes);
  void* reg_c = tapp::alloc_aligned(reg_bytes);
  void* reg_d = tapp::alloc_aligned(reg_bytes);
  void* reg_e = tapp::alloc_aligned(reg_bytes);
  std::memset(reg_d, 4, reg_bytes);
  std::memset(reg_e, 5, reg_bytes);
  std::memset(reg_b, 2, reg_bytes);
  std::memset(reg_c, 3, reg_bytes);

  // Warm the copy path.
  for (int i = 0; i < 5; ++i) {
    CHECK(cudaMemcpyAsync(dev_copy, pinned, copy_bytes, cudaMemcpyHostToDevice, s_copy));
    CHECK(cudaStreamSynchronize(s_copy));
  }

  auto phase = [&](int which) {  // 0 baseline, 1 unregister, 2 register, 3 free, 4 idle, 5 evict
    PhaseResult r;
    if (!run_phase[which]) return r;
    if (which == 1) {
      for (void* p : reg_a) CHECK(cudaHostRegister(p, reg_bytes, 0));
    }
    void* pooled = which == 3 ? reg_c : which == 4 ? reg_d : which == 5 ? reg_e : nullptr;
    if (pooled != nullptr) {
      CHECK(cudaHostRegister(pooled, reg_bytes, 0));
      CHECK(cudaHostUnregister(pooled));
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<double> times;
    times.reserve(100000);
    std::atomic<int> go{0};
    std::thread b(copier, s_copy, dev_copy, pinned, copy_bytes, &go, 2 * kernel_ms * 1000.0,
                  &times);
    CHECK(cudaEventRecord(k0, s_kernel));
    spin_kernel<<<1, 1, 0, s_kernel>>>(cycles, static_cast<int*>(dev_out));
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(k1, s_kernel));
    go.store(1);
    double until = tapp::now_us() + delay_ms * 1000.0;
    while (tapp::now_us() < until) {
    }
    double t0 = tapp::now_us();
    std::vector<double> unregisters;
    for (int i = 0; which == 1 && i < kUnregisters; ++i) {
      const double u0 = tapp::now_us();
      CHECK(cudaHostUnregister(reg_a[i]));
      unregisters.push_back(tapp::now_us() - u0);
    }
    if (which == 2) CHECK(cudaHostRegister(reg_b, reg_bytes, 0));
    if (which == 3) std::free(reg_c);
    if (which == 5) CHECK(cudaHostRegister(reg_e, reg_bytes / 2, 0));
    r.call_us = which == 1 ? unregisters[0] : tapp::now_us() - t0;
    r.median_call_us = which == 1 ? tapp::stats(unregisters).median : r.call_us;
    b.join();
    CHECK(cudaEventSynchronize(k1));
    CHECK(cudaEventElapsedTime(&r.kernel_ms, k0, k1));
    if (which == 2) CHECK(cudaHostUnregister(reg_b));
    if (which == 5) CHECK(cudaHostUnregister(reg_e));
    r.copies = tapp::stats(times);
    std::printf("stall %-10s call=%.1f us  B copies=%zu worst=%.1f us median=%.1f us  kernel=%.1f ms\n",
                names[which], r.call_us, r.copies.n, r.copies.max, r.copies.median, r.kernel_ms);
    std::printf("phase=%s worst_copy_us=%.1f release_us=%.1f\n", names[which], r.copies.max,
                which == 0 || which == 4 ? 0.0 : r.call_us);
    std::fflush(stdout);
    return r;
  };

  PhaseResult base = phase(0);
  PhaseResult unreg = phase(1);
  PhaseResult reg = phase(2);
  PhaseResult freed = phase(3);
  phase(4);
  phase(5);

  std::printf("RESULT app=stall kernel_ms=%.2f unreg_us=%.2f unreg_median_us=%.2f reg_us=%.2f "
              "worst_copy_us=%.2f "
              "median_copy_us=%.2f worst_copy_baseline_us=%.2f median_copy_baseline_us=%.2f "
              "worst_copy_reg_us=%.2f copies=%zu copies_baseline=%zu free_us=%.2f "
              "worst_copy_free_us=%.2f\n",
              unreg.kernel_ms, unreg.call_us, unreg.median_call_us, reg.call_us, unreg.copies.max,
              unreg.copies.median,              base.copies.max, base.copies.median, reg.copies.max, unreg.copies.n, base.copies.n,
              freed.call_us, freed.copies.max);

  CHECK(cudaEventDestroy(k0));
  CHECK(cudaEventDestroy(k1));
  CHECK(cudaStreamDestroy(s_kernel));
  CHECK(cudaStreamDestroy(s_copy));
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFree(dev_copy));
  CHECK(cudaFree(dev_out));
  for (void* p : reg_a) std::free(p);
  std::free(reg_b);
  std::free(reg_d);
  std::free(reg_e);
  return 0;
}
