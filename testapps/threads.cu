// threads.cu: T threads, each looping register / copy / unregister on its own
// buffer.
//
// Scenario: concurrent pinning from many host threads (e.g. data-loader
// workers). Each thread owns a page-aligned host buffer, a check buffer and a
// device buffer; every iteration it stamps a new tag into each 4 KiB page,
// cudaHostRegister, cudaMemcpy H2D (legacy default stream), cudaHostUnregister.
// All threads start together (barrier). Every --verify-every iterations and at
// the end each thread copies its device buffer back and compares
// ("DATA MISMATCH", exit 2).
//
// CLI: threads [--threads 16] [--size 1M] [--iters 100] [--warmup 3]
//              [--verify-every 16] [--quick]
//   --quick  --threads 4 --size 256K --iters 20 --warmup 2
// Prints aggregate throughput and per-op medians, and
//   RESULT app=threads threads=<T> size=<bytes> iters=<per thread> op_median_us=
//          op_p90_us= reg_us= copy_us= unreg_us= ops_per_s=<aggregate iterations/s>
//          gbps=<aggregate copied GB/s, wall>
#include "common.h"

#include <cuda_runtime.h>

#include <atomic>
#include <thread>
#include <vector>

namespace {

const char* kUsage =
    "usage: threads [--threads 16] [--size 1M] [--iters 100] [--warmup 3] [--verify-every 16] [--quick]\n";

struct ThreadOut {
  std::vector<double> op, reg, copy, unreg;
  double start = 0, end = 0;
};

std::atomic<int> g_ready{0};
std::atomic<int> g_go{0};

void verify(int t, unsigned char* host, unsigned char* check, void* dev, size_t bytes) {
  CHECK(cudaMemcpy(check, dev, bytes, cudaMemcpyDeviceToHost));
  long long off = tapp::first_diff(host, check, bytes);
  if (off >= 0) {
    char what[64];
    std::snprintf(what, sizeof what, "thread=%d size=%zu", t, bytes);
    tapp::data_mismatch("threads", what, off);
  }
}

void worker(int t, size_t bytes, int iters, int warmup, int verify_every, ThreadOut* out) {
  CHECK(cudaSetDevice(0));
  unsigned char* host = static_cast<unsigned char*>(tapp::alloc_aligned(bytes));
  unsigned char* check = static_cast<unsigned char*>(tapp::alloc_aligned(bytes));
  tapp::fill_full(host, bytes, static_cast<uint64_t>(t) + 1);
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, bytes));
  out->op.reserve(iters);
  g_ready.fetch_add(1);
  while (g_go.load() == 0) {
  }
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == warmup) out->start = tapp::now_us();
    tapp::stamp_pages(host, bytes, static_cast<uint64_t>(t) + 100, static_cast<uint64_t>(i));
    double t0 = tapp::now_us();
    CHECK(cudaHostRegister(host, bytes, 0));
    double t1 = tapp::now_us();
    CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    double t2 = tapp::now_us();
    CHECK(cudaHostUnregister(host));
    double t3 = tapp::now_us();
    if (i >= warmup) {
      out->op.push_back(t3 - t0);
      out->reg.push_back(t1 - t0);
      out->copy.push_back(t2 - t1);
      out->unreg.push_back(t3 - t2);
    }
    if (verify_every > 0 && (i + 1) % verify_every == 0) verify(t, host, check, dev, bytes);
  }
  out->end = tapp::now_us();
  verify(t, host, check, dev, bytes);
  CHECK(cudaFree(dev));
  std::free(host);
  std::free(check);
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"threads", "size", "iters", "warmup", "verify-every"}, {"quick"},
                  kUsage);
  const bool quick = args.has("quick");
  const int T = static_cast<int>(args.num("threads", quick ? 4 : 16));
  const size_t bytes = args.size("size", quick ? (256 << 10) : (1 << 20));
  const int iters = static_cast<int>(args.num("iters", quick ? 20 : 100));
  const int warmup = static_cast<int>(args.num("warmup", quick ? 2 : 3));
  const int verify_every = static_cast<int>(args.num("verify-every", 16));
  if (T < 1 || bytes == 0 || iters < 1 || warmup < 0) args.die("bad arguments");

  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));

  std::vector<ThreadOut> outs(T);
  std::vector<std::thread> th;
  for (int t = 0; t < T; ++t) th.emplace_back(worker, t, bytes, iters, warmup, verify_every, &outs[t]);
  while (g_ready.load() < T) std::this_thread::yield();
  g_go.store(1);
  for (auto& x : th) x.join();

  std::vector<double> op, reg, copy, unreg;
  double start = 1e300, end = 0;
  for (const ThreadOut& o : outs) {
    op.insert(op.end(), o.op.begin(), o.op.end());
    reg.insert(reg.end(), o.reg.begin(), o.reg.end());
    copy.insert(copy.end(), o.copy.begin(), o.copy.end());
    unreg.insert(unreg.end(), o.unreg.begin(), o.unreg.end());
    start = std::min(start, o.start);
    end = std::max(end, o.end);
  }
  double wall_s = (end - start) * 1e-6;
  double total_ops = static_cast<double>(T) * iters;
  double ops_per_s = wall_s > 0 ? total_ops / wall_s : 0;
  double gbps = wall_s > 0 ? total_ops * static_cast<double>(bytes) / wall_s * 1e-9 : 0;
  tapp::Stats so = tapp::stats(op), sr = tapp::stats(reg), sc = tapp::stats(copy),
              su = tapp::stats(unreg);
  std::printf("threads T=%d size=%s iters=%d: %.0f ops/s, %.2f GB/s aggregate; per op median=%.1f us "
              "(p90 %.1f) register=%.1f us copy=%.1f us unregister=%.1f us\n",
              T, tapp::size_name(bytes).c_str(), iters, ops_per_s, gbps, so.median, so.p90, sr.median,
              sc.median, su.median);
  std::printf("RESULT app=threads threads=%d size=%zu iters=%d op_median_us=%.2f op_p90_us=%.2f "
              "reg_us=%.2f copy_us=%.2f unreg_us=%.2f ops_per_s=%.1f gbps=%.3f\n",
              T, bytes, iters, so.median, so.p90, sr.median, sc.median, su.median, ops_per_s, gbps);
  return 0;
}
