// pipeline.cu: a double-buffered producer that pins each batch around its
// transfer.
//
// Scenario: two slots (host buffer malloc'd page-aligned, device input and
// output buffers, a non-blocking stream, an event). Per batch b, slot b%2:
// if the slot was used, cudaEventSynchronize(its event) then cudaHostUnregister
// its host buffer; fill the host buffer on the CPU; cudaHostRegister it;
// cudaMemcpyAsync H2D on the slot's stream; a small kernel (out = 2*in) on that
// stream; cudaEventRecord. The unregister of one slot runs while the other
// slot's copy and kernel are in flight, so a real unregister (which waits for
// all device work) serialises the pipeline; a deferred one does not.
// After the last batch each slot's device input is copied back and compared
// with the host data of its last batch ("DATA MISMATCH", exit 2). The kernel's
// output is checked only with --check-kernel (GPU only: on the simulator kernels
// do not run).
//
// CLI: pipeline [--batches 200] [--size 4M] [--warmup 5] [--check-kernel] [--quick]
//   --quick  --batches 20 --size 256K --warmup 2
// Prints the batch-time statistics and
//   RESULT app=pipeline size=<bytes> batches=<n> median_batch_us= p90_batch_us=
//          min_batch_us= reg_us= unreg_us= fill_us= gbps=<size/median batch>
#include "common.h"

#include <cuda_runtime.h>

#include <vector>

namespace {

const char* kUsage =
    "usage: pipeline [--batches 200] [--size 4M] [--warmup 5] [--check-kernel] [--quick]\n";

__global__ void scale_kernel(const unsigned int* in, unsigned int* out, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (; i < n; i += stride) out[i] = in[i] * 2u;
}

void fill(unsigned int* p, size_t words, uint64_t batch) {
  unsigned int x = static_cast<unsigned int>(batch * 2654435761u + 12345u);
  for (size_t i = 0; i < words; ++i) p[i] = x + static_cast<unsigned int>(i);
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"batches", "size", "warmup"}, {"quick", "check-kernel"}, kUsage);
  const bool quick = args.has("quick");
  const int batches = static_cast<int>(args.num("batches", quick ? 20 : 200));
  size_t bytes = args.size("size", quick ? (256 << 10) : (4 << 20));
  const int warmup = static_cast<int>(args.num("warmup", quick ? 2 : 5));
  const bool check_kernel = args.has("check-kernel");
  bytes = (bytes + 3) / 4 * 4;
  if (batches < 1 || bytes == 0 || warmup < 0 || warmup >= batches) args.die("bad arguments");
  const size_t words = bytes / 4;

  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));

  unsigned int* host[2];
  unsigned int *din[2], *dout[2];
  cudaStream_t st[2];
  cudaEvent_t ev[2];
  bool used[2] = {false, false};
  uint64_t last_batch[2] = {0, 0};
  for (int s = 0; s < 2; ++s) {
    host[s] = static_cast<unsigned int*>(tapp::alloc_aligned(bytes));
    CHECK(cudaMalloc(&din[s], bytes));
    CHECK(cudaMalloc(&dout[s], bytes));
    CHECK(cudaStreamCreateWithFlags(&st[s], cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&ev[s], cudaEventDisableTiming));
  }

  std::vector<double> batch_us, reg_us, unreg_us, fill_us;
  double prev = tapp::now_us();
  for (int b = 0; b < batches; ++b) {
    const int s = b % 2;
    double t_unreg = 0;
    if (used[s]) {
      CHECK(cudaEventSynchronize(ev[s]));
      double t0 = tapp::now_us();
      CHECK(cudaHostUnregister(host[s]));
      t_unreg = tapp::now_us() - t0;
    }
    double f0 = tapp::now_us();
    fill(host[s], words, static_cast<uint64_t>(b));
    double f1 = tapp::now_us();
    CHECK(cudaHostRegister(host[s], bytes, 0));
    double r1 = tapp::now_us();
    CHECK(cudaMemcpyAsync(din[s], host[s], bytes, cudaMemcpyHostToDevice, st[s]));
    unsigned int blocks = static_cast<unsigned int>(std::min<size_t>((words + 255) / 256, 1024));
    scale_kernel<<<blocks, 256, 0, st[s]>>>(din[s], dout[s], words);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(ev[s], st[s]));
    used[s] = true;
    last_batch[s] = static_cast<uint64_t>(b);
    double now = tapp::now_us();
    if (b >= warmup) {
      batch_us.push_back(now - prev);
      reg_us.push_back(r1 - f1);
      fill_us.push_back(f1 - f0);
      if (used[s] && b >= 2) unreg_us.push_back(t_unreg);
    }
    prev = now;
  }
  for (int s = 0; s < 2; ++s) {
    if (!used[s]) continue;
    CHECK(cudaEventSynchronize(ev[s]));
    CHECK(cudaHostUnregister(host[s]));
  }
  CHECK(cudaDeviceSynchronize());

  // Verify: each slot's device input holds its last batch.
  std::vector<unsigned int> expect(words), got(words);
  for (int s = 0; s < 2; ++s) {
    if (!used[s]) continue;
    fill(expect.data(), words, last_batch[s]);
    CHECK(cudaMemcpy(got.data(), din[s], bytes, cudaMemcpyDeviceToHost));
    long long off = tapp::first_diff(expect.data(), got.data(), bytes);
    if (off >= 0) tapp::data_mismatch("pipeline", s ? "slot=1 input" : "slot=0 input", off);
    if (check_kernel) {
      for (size_t i = 0; i < words; ++i) expect[i] *= 2u;
      CHECK(cudaMemcpy(got.data(), dout[s], bytes, cudaMemcpyDeviceToHost));
      off = tapp::first_diff(expect.data(), got.data(), bytes);
      if (off >= 0) tapp::data_mismatch("pipeline", s ? "slot=1 kernel" : "slot=0 kernel", off);
    }
  }

  tapp::Stats sb = tapp::stats(batch_us), sr = tapp::stats(reg_us), su = tapp::stats(unreg_us),
              sf = tapp::stats(fill_us);
  double gbps = sb.median > 0 ? static_cast<double>(bytes) / (sb.median * 1e3) : 0;
  std::printf("pipeline size=%s batches=%d: batch median=%.1f us p90=%.1f us min=%.1f us "
              "(fill %.1f us, register %.1f us, unregister %.1f us) %.2f GB/s\n",
              tapp::size_name(bytes).c_str(), batches, sb.median, sb.p90, sb.min, sf.median,
              sr.median, su.median, gbps);
  std::printf("RESULT app=pipeline size=%zu batches=%d median_batch_us=%.2f p90_batch_us=%.2f "
              "min_batch_us=%.2f reg_us=%.2f unreg_us=%.2f fill_us=%.2f gbps=%.3f\n",
              bytes, batches, sb.median, sb.p90, sb.min, sr.median, su.median, sf.median, gbps);

  for (int s = 0; s < 2; ++s) {
    CHECK(cudaFree(din[s]));
    CHECK(cudaFree(dout[s]));
    CHECK(cudaStreamDestroy(st[s]));
    CHECK(cudaEventDestroy(ev[s]));
    std::free(host[s]);
  }
  return 0;
}
