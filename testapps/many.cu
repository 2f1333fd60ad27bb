// many.cu: many small buffers, each registered, copied and unregistered.
//
// Scenario: N page-aligned buffers of --buffer-bytes (64 KiB), touched round
// robin. Two modes per N:
//   interleaved  per buffer: cudaHostRegister, cudaMemcpy H2D of --copy-bytes,
//                cudaHostUnregister; then the next buffer
//   batch        register all N, then copy from each, then unregister all N
//                (the brief's "1000 buffers of 64 KiB: 37 us to register each,
//                29 us to unregister each")
// Every iteration re-stamps each buffer's first --copy-bytes; copies go to slot
// i of a device array; after the last iteration the device array is copied back
// and compared ("DATA MISMATCH", exit 2). With lazypin's pool bounded below N,
// this exercises eviction.
//
// CLI: many [--buffers 1000,10000] [--iters 3] [--warmup 1] [--buffer-bytes 64K]
//           [--copy-bytes 4K] [--modes interleaved,batch] [--quick]
//   --quick  --buffers 200 --iters 2 --warmup 1
// Prints a human line per (N, mode) and
//   RESULT app=many buffers=<N> mode=<interleaved|batch> buffer_bytes= copy_bytes=
//          iters= op_median_us=<per buffer reg+copy+unreg> op_p90_us= reg_us=
//          copy_us= unreg_us= ops_per_s=<buffers per second, wall>
#include "common.h"

#include <cuda_runtime.h>

#include <string>
#include <vector>

namespace {

const char* kUsage =
    "usage: many [--buffers 1000,10000] [--iters 3] [--warmup 1] [--buffer-bytes 64K]\n"
    "            [--copy-bytes 4K] [--modes interleaved,batch] [--quick]\n";

std::vector<long long> parse_list(const tapp::Args& a, const std::string& n, const std::string& def) {
  std::string s = a.str(n, def);
  std::vector<long long> out;
  for (size_t pos = 0; pos <= s.size();) {
    size_t c = s.find(',', pos);
    if (c == std::string::npos) c = s.size();
    std::string item = s.substr(pos, c - pos);
    if (!item.empty()) {
      char* end = nullptr;
      long long v = std::strtoll(item.c_str(), &end, 10);
      if (*end || v <= 0) a.die("bad --" + n + " item: " + item);
      out.push_back(v);
    }
    pos = c + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"buffers", "iters", "warmup", "buffer-bytes", "copy-bytes", "modes"},
                  {"quick"}, kUsage);
  const bool quick = args.has("quick");
  std::vector<long long> counts = parse_list(args, "buffers", quick ? "200" : "1000,10000");
  const int iters = static_cast<int>(args.num("iters", quick ? 2 : 3));
  const int warmup = static_cast<int>(args.num("warmup", 1));
  const size_t buf_bytes = args.size("buffer-bytes", 64 << 10);
  const size_t copy_bytes = std::min(args.size("copy-bytes", 4 << 10), buf_bytes);
  std::string modes_s = args.str("modes", "interleaved,batch");
  std::vector<std::string> modes;
  for (size_t pos = 0; pos <= modes_s.size();) {
    size_t c = modes_s.find(',', pos);
    if (c == std::string::npos) c = modes_s.size();
    std::string m = modes_s.substr(pos, c - pos);
    if (m != "interleaved" && m != "batch") args.die("bad mode: " + m);
    modes.push_back(m);
    pos = c + 1;
  }
  if (iters < 1 || warmup < 0 || buf_bytes == 0 || copy_bytes == 0) args.die("bad arguments");

  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));

  for (long long n : counts) {
    const size_t N = static_cast<size_t>(n);
    std::vector<unsigned char*> bufs(N);
    for (size_t i = 0; i < N; ++i) {
      bufs[i] = static_cast<unsigned char*>(tapp::alloc_aligned(buf_bytes));
      std::memset(bufs[i], 0, buf_bytes);
    }
    unsigned char* dev = nullptr;
    CHECK(cudaMalloc(&dev, N * copy_bytes));
    std::vector<unsigned char> check(N * copy_bytes);

    for (const std::string& mode : modes) {
      std::vector<double> op, reg, copy, unreg;
      double wall = 0;
      uint64_t last_iter = 0;
      for (int it = 0; it < warmup + iters; ++it) {
        last_iter = static_cast<uint64_t>(it) + (mode == "batch" ? 1000 : 0);
        for (size_t i = 0; i < N; ++i) tapp::stamp_pages(bufs[i], copy_bytes, i, last_iter);
        const bool keep = it >= warmup;
        double w0 = tapp::now_us();
        if (mode == "interleaved") {
          for (size_t i = 0; i < N; ++i) {
            double t0 = tapp::now_us();
            CHECK(cudaHostRegister(bufs[i], buf_bytes, 0));
            double t1 = tapp::now_us();
            CHECK(cudaMemcpy(dev + i * copy_bytes, bufs[i], copy_bytes, cudaMemcpyHostToDevice));
            double t2 = tapp::now_us();
            CHECK(cudaHostUnregister(bufs[i]));
            double t3 = tapp::now_us();
            if (keep) {
              op.push_back(t3 - t0);
              reg.push_back(t1 - t0);
              copy.push_back(t2 - t1);
              unreg.push_back(t3 - t2);
            }
          }
        } else {
          std::vector<double> r(N), c(N);
          for (size_t i = 0; i < N; ++i) {
            double t0 = tapp::now_us();
            CHECK(cudaHostRegister(bufs[i], buf_bytes, 0));
            r[i] = tapp::now_us() - t0;
          }
          for (size_t i = 0; i < N; ++i) {
            double t0 = tapp::now_us();
            CHECK(cudaMemcpy(dev + i * copy_bytes, bufs[i], copy_bytes, cudaMemcpyHostToDevice));
            c[i] = tapp::now_us() - t0;
          }
          for (size_t i = 0; i < N; ++i) {
            double t0 = tapp::now_us();
            CHECK(cudaHostUnregister(bufs[i]));
            double u = tapp::now_us() - t0;
            if (keep) {
              op.push_back(r[i] + c[i] + u);
              reg.push_back(r[i]);
              copy.push_back(c[i]);
              unreg.push_back(u);
            }
          }
        }
        if (keep) wall += tapp::now_us() - w0;
      }
      // Verify the last iteration's data.
      CHECK(cudaMemcpy(check.data(), dev, N * copy_bytes, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < N; ++i) {
        long long off = tapp::first_diff(bufs[i], check.data() + i * copy_bytes, copy_bytes);
        if (off >= 0) {
          char what[128];
          std::snprintf(what, sizeof what, "mode=%s buffers=%zu buffer=%zu", mode.c_str(), N, i);
          tapp::data_mismatch("many", what, off);
        }
      }
      tapp::Stats so = tapp::stats(op), sr = tapp::stats(reg), sc = tapp::stats(copy),
                  su = tapp::stats(unreg);
      double ops_per_s = wall > 0 ? static_cast<double>(N) * iters / (wall * 1e-6) : 0;
      std::printf("many N=%-6zu %-11s per buffer: total=%.1f us (p90 %.1f) register=%.1f us "
                  "copy=%.1f us unregister=%.1f us  %.0f buffers/s\n",
                  N, mode.c_str(), so.median, so.p90, sr.median, sc.median, su.median, ops_per_s);
      std::printf("RESULT app=many buffers=%zu mode=%s buffer_bytes=%zu copy_bytes=%zu iters=%d "
                  "op_median_us=%.2f op_p90_us=%.2f reg_us=%.2f copy_us=%.2f unreg_us=%.2f "
                  "ops_per_s=%.1f\n",
                  N, mode.c_str(), buf_bytes, copy_bytes, iters, so.median, so.p90, sr.median,
                  sc.median, su.median, ops_per_s);
      std::fflush(stdout);
    }
    CHECK(cudaFree(dev));
    for (unsigned char* b : bufs) std::free(b);
  }
  return 0;
}
