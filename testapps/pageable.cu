// pageable.cu: host<->device copy times from pageable (malloc'd) memory and
// from memory kept pinned, per size and direction.
// Run it bare and under LAZYPIN_MODE=defer LAZYPIN_AUTOPIN=1 (scripts/gpu-suite
// --only pageable does both): with auto-pin, the "pageable" rows should move
// to the pinned rows' rate after the first copy.
//
// For each size, direction (h2d, d2h) and API (memcpy: cudaMemcpy; async:
// cudaMemcpyAsync + cudaStreamSynchronize, as PyTorch's .cuda() does), two paths:
//   pageable  a fresh malloc'd buffer (pages touched first): the first copy,
//             then the median of --repeat more
//   pinned    a fresh buffer, cudaHostRegister + first copy timed together,
//             then the median of --repeat more, kept registered throughout
// Each row's bytes are checked after the timed copies.
//
// CLI: pageable [--sizes 4M,64M,1G] [--repeat 10] [--apis memcpy,async]
// Prints "ROW size=<s> dir=<d> api=<a> path=<p> first_us=<f> median_us=<m> gbps=<g>"
// and "PAGEABLE ok". Exit: 0 ok; 1 CUDA error; 2 data mismatch.
#include "common.h"

#include <sstream>

namespace {

struct Timing {
  double first_us, median_us;
};

int Copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, bool async, cudaStream_t s) {
  if (!async) return cudaMemcpy(dst, src, n, kind);
  const cudaError_t rc = cudaMemcpyAsync(dst, src, n, kind, s);
  return rc != cudaSuccess ? rc : cudaStreamSynchronize(s);
}

// `register_first`: the pinned path (its first time includes the register).
Timing Measure(size_t n, bool h2d, bool async, bool register_first, int repeat, void* dev,
               cudaStream_t s) {
  unsigned char* host = static_cast<unsigned char*>(tapp::alloc_aligned(n));
  tapp::fill_full(host, n, 7);
  const cudaMemcpyKind kind = h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  void* dst = h2d ? dev : static_cast<void*>(host);
  const void* src = h2d ? static_cast<const void*>(host) : dev;
  if (!h2d) CHECK(cudaMemset(dev, 0x5a, n));
  CHECK(cudaDeviceSynchronize());
  Timing t;
  double t0 = tapp::now_us();
  if (register_first) CHECK(cudaHostRegister(host, n, 0));
  CHECK(static_cast<cudaError_t>(Copy(dst, src, n, kind, async, s)));
  t.first_us = tapp::now_us() - t0;
  std::vector<double> times;
  for (int i = 0; i < repeat; ++i) {
    t0 = tapp::now_us();
    CHECK(static_cast<cudaError_t>(Copy(dst, src, n, kind, async, s)));
    times.push_back(tapp::now_us() - t0);
  }
  t.median_us = tapp::stats(times).median;
  // The bytes: the device holds the host's pattern (h2d), the host the device's (d2h).
  std::vector<unsigned char> probe(4096);
  for (size_t off : {size_t{0}, n / 2, n - probe.size()}) {
    if (h2d) {
      CHECK(cudaMemcpy(probe.data(), static_cast<char*>(dev) + off, probe.size(),
                       cudaMemcpyDeviceToHost));
      if (memcmp(probe.data(), host + off, probe.size()) != 0) tapp::data_mismatch("pageable", "h2d", off);
    } else {
      for (size_t i = 0; i < probe.size(); ++i) {
        if (host[off + i] != 0x5a) tapp::data_mismatch("pageable", "d2h", off + i);
      }
    }
  }
  if (register_first) CHECK(cudaHostUnregister(host));
  free(host);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"sizes", "repeat", "apis"}, {},
                  "usage: pageable [--sizes 4M,64M,1G] [--repeat 10] [--apis memcpy,async]\n");
  const int repeat = static_cast<int>(args.num("repeat", 10));
  std::vector<size_t> sizes;
  std::stringstream list(args.str("sizes", "4M,64M,1G"));
  for (std::string item; std::getline(list, item, ',');) {
    size_t v;
    if (!tapp::parse_size(item, &v)) args.die("bad --sizes");
    sizes.push_back(v);
  }
  std::vector<std::string> apis;
  std::stringstream alist(args.str("apis", "memcpy,async"));
  for (std::string item; std::getline(alist, item, ',');) apis.push_back(item);
  size_t largest = 0;
  for (size_t n : sizes) largest = std::max(largest, n);
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, largest));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Warm the copy engines and the driver's staging buffers.
  Measure(1 << 20, true, false, false, 2, dev, s);
  for (size_t n : sizes) {
    for (const std::string& api : apis) {
      for (bool h2d : {true, false}) {
        for (bool pinned : {false, true}) {
          const Timing t = Measure(n, h2d, api == "async", pinned, repeat, dev, s);
          printf("ROW size=%s dir=%s api=%s path=%s first_us=%.1f median_us=%.1f gbps=%.2f\n",
                 tapp::size_name(n).c_str(), h2d ? "h2d" : "d2h", api.c_str(),
                 pinned ? "pinned" : "pageable", t.first_us, t.median_us, n / t.median_us / 1e3);
          fflush(stdout);
        }
      }
    }
  }
  CHECK(cudaFree(dev));
  printf("PAGEABLE ok\n");
  return 0;
}
