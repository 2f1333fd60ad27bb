// diffseq.cu: the differential check. A long, deterministic sequence of
// runtime calls on host memory, printing one line per step:
//   STEP <n> <desc> -> <code> [extra fields] last=<cudaGetLastError() after the step>
// and finally "DONE steps=<n>". The output must be IDENTICAL with and without
// lazypin (LD_PRELOAD), in every lazypin mode; raw pointers are never printed,
// only codes and derived values (flags, memory type, device, "dp==p" booleans).
//
// Covered: register / unregister / re-register of the same memory, double
// register (712), double unregister (713), interior-pointer unregister,
// overlapping, adjacent and sub-ranges, flags Portable / DeviceMap / ReadOnly
// and combinations, cudaHostGetFlags, cudaHostGetDevicePointer,
// cudaPointerGetAttributes (type, device, devicePointer==p, hostPointer==p),
// unaligned malloc(1000) buffers, two sub-page ranges in one page, a range
// straddling a page boundary, pageable copies, copies H2D and D2H of known
// patterns from/to registered and unregistered buffers with verification,
// free() / munmap() of a registered-then-unregistered buffer and a new
// allocation at a possibly reused address (register, copy, verify),
// cudaMallocHost memory passed to register/unregister, and cudaDeviceReset
// with a registration alive.
// Steps whose desc starts with "stale:" query memory the program has already
// unregistered (or registered before a reset): a lazypin that keeps the real
// registration alive must hide it from those queries too. --no-stale-queries
// skips them (printing "-> SKIPPED", numbering unchanged).
//
// CLI: diffseq [--no-stale-queries] [--quick]   (--quick changes nothing)
// Exit: 0 whatever the codes (it prints them); 2 on a data mismatch
// ("DATA MISMATCH"); 1 if setup (cudaMalloc of the scratch buffers) fails.
// Addresses that got reused are reported on stderr only.
#include "common.h"

#include <cuda_runtime.h>
#include <malloc.h>
#include <sys/mman.h>

#include <string>

namespace {

int g_step = 0;
bool g_skip_stale = false;
unsigned char* g_dev = nullptr;    // device scratch, kScratch bytes
unsigned char* g_check = nullptr;  // host scratch, never registered
const size_t kScratch = 1 << 20;
const size_t P = tapp::kPage;

void line(const std::string& desc, const char* code_text, const std::string& extra) {
  int last = static_cast<int>(cudaGetLastError());
  std::printf("STEP %d %s -> %s%s%s last=%d\n", g_step, desc.c_str(), code_text,
              extra.empty() ? "" : " ", extra.c_str(), last);
  std::fflush(stdout);
}

void step(const std::string& desc, cudaError_t code, const std::string& extra = "") {
  ++g_step;
  char c[16];
  std::snprintf(c, sizeof c, "%d", static_cast<int>(code));
  line(desc, c, extra);
}

bool skip_stale(const std::string& desc) {
  if (!g_skip_stale) return false;
  ++g_step;
  std::printf("STEP %d %s -> SKIPPED\n", g_step, desc.c_str());
  return true;
}

std::string fmt(const char* f, long long a) {
  char b[128];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

void reg(const std::string& name, void* p, size_t n, unsigned flags) {
  step("register " + name + fmt(" %lld", static_cast<long long>(n)) + fmt(" flags=%lld", flags),
       cudaHostRegister(p, n, flags));
}
void unreg(const std::string& name, void* p) { step("unregister " + name, cudaHostUnregister(p)); }

void getflags(const std::string& name, void* p, bool stale = false) {
  std::string d = std::string(stale ? "stale:" : "") + "getflags " + name;
  if (stale && skip_stale(d)) return;
  unsigned int f = 0;
  cudaError_t e = cudaHostGetFlags(&f, p);
  step(d, e, e == cudaSuccess ? fmt("flags=%lld", f) : "");
}

void devptr(const std::string& name, void* p, bool stale = false) {
  std::string d = std::string(stale ? "stale:" : "") + "devptr " + name;
  if (stale && skip_stale(d)) return;
  void* dp = nullptr;
  cudaError_t e = cudaHostGetDevicePointer(&dp, p, 0);
  step(d, e, e == cudaSuccess ? fmt("dp==p=%lld", dp == p) : "");
}

void ptrattr(const std::string& name, void* p, bool stale = false) {
  std::string d = std::string(stale ? "stale:" : "") + "ptrattr " + name;
  if (stale && skip_stale(d)) return;
  cudaPointerAttributes a;
  std::memset(&a, 0, sizeof a);
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  std::string x;
  if (e == cudaSuccess) {
    x = fmt("type=%lld", static_cast<int>(a.type)) + fmt(" device=%lld", a.device) +
        fmt(" dp==p=%lld", a.devicePointer == p) + fmt(" hp==p=%lld", a.hostPointer == p);
  }
  step(d, e, x);
}

// H2D from p (filled with a pattern), D2H into the unregistered scratch, compare.
void copy_from(const std::string& name, void* p, size_t n, uint64_t seed) {
  ++g_step;
  tapp::fill_full(p, n, seed);
  cudaError_t e1 = cudaMemcpy(g_dev, p, n, cudaMemcpyHostToDevice);
  std::memset(g_check, 0xEE, n);
  cudaError_t e2 = cudaMemcpy(g_check, g_dev, n, cudaMemcpyDeviceToHost);
  std::string verdict = "skipped";
  if (e1 == cudaSuccess && e2 == cudaSuccess) {
    long long off = tapp::first_diff(p, g_check, n);
    if (off >= 0) tapp::data_mismatch("diffseq", ("step " + std::to_string(g_step) + " h2d " + name).c_str(), off);
    verdict = "ok";
  }
  char c[16];
  std::snprintf(c, sizeof c, "%d", static_cast<int>(e1));
  line("h2d " + name + fmt(" %lld", static_cast<long long>(n)), c,
       fmt("d2h=%lld", static_cast<int>(e2)) + " verify=" + verdict);
}

// Pattern into the device through the scratch, then D2H into p, compare.
void copy_into(const std::string& name, void* p, size_t n, uint64_t seed) {
  ++g_step;
  tapp::fill_full(g_check, n, seed);
  cudaError_t e1 = cudaMemcpy(g_dev, g_check, n, cudaMemcpyHostToDevice);
  std::memset(p, 0x5A, n);
  cudaError_t e2 = cudaMemcpy(p, g_dev, n, cudaMemcpyDeviceToHost);
  std::string verdict = "skipped";
  if (e1 == cudaSuccess && e2 == cudaSuccess) {
    long long off = tapp::first_diff(p, g_check, n);
    if (off >= 0) tapp::data_mismatch("diffseq", ("step " + std::to_string(g_step) + " d2h " + name).c_str(), off);
    verdict = "ok";
  }
  char c[16];
  std::snprintf(c, sizeof c, "%d", static_cast<int>(e2));
  line("d2h " + name + fmt(" %lld", static_cast<long long>(n)), c,
       fmt("h2d=%lld", static_cast<int>(e1)) + " verify=" + verdict);
}

void* map_anon(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {}, {"no-stale-queries", "quick"},
                  "usage: diffseq [--no-stale-queries] [--quick]\n");
  g_skip_stale = args.has("no-stale-queries");
  // Fixed mmap threshold: glibc's dynamic threshold would otherwise move the
  // second 1 MiB malloc below from mmap to the heap.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);

  step("setdevice 0", cudaSetDevice(0));
  CHECK(cudaMalloc(&g_dev, kScratch));
  g_check = static_cast<unsigned char*>(tapp::alloc_aligned(kScratch));
  {
    int ro = -1, uva = -1;
    CHECK(cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, 0));
    CHECK(cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, 0));
    std::fprintf(stderr, "diffseq: readOnlySupported=%d unifiedAddressing=%d\n", ro, uva);
  }

  // A: 32 pages, page-aligned. "A" = its first 16 pages.
  unsigned char* A = static_cast<unsigned char*>(tapp::alloc_aligned(32 * P));
  std::memset(A, 0, 32 * P);
  const size_t AL = 16 * P;

  // --- basic register / query / copy / unregister
  reg("A", A, AL, 0);
  getflags("A", A);
  devptr("A", A);
  devptr("A+4096", A + P);
  ptrattr("A", A);
  ptrattr("A+4096", A + P);
  copy_from("A", A, AL, 1);
  copy_into("A", A, AL, 2);
  reg("A", A, AL, 0);                  // 712
  reg("A+4096", A + P, P, 0);          // 712: sub-range of a registered range
  reg("A+8p", A + 8 * P, AL, 0);       // 712: overlaps the second half
  unreg("A+4096", A + P);              // interior pointer
  unreg("A", A);                       // 0
  unreg("A", A);                       // 713
  unreg("A+8p", A + 8 * P);            // never registered: 713
  ptrattr("A", A, true);
  getflags("A", A, true);
  devptr("A", A, true);

  // --- re-register the same memory, then with each flag
  reg("A", A, AL, 0);
  getflags("A", A);
  copy_from("A", A, AL, 3);
  unreg("A", A);
  reg("A", A, AL, cudaHostRegisterPortable);
  getflags("A", A);
  copy_from("A", A, AL, 4);
  unreg("A", A);
  reg("A", A, AL, cudaHostRegisterMapped);
  getflags("A", A);
  devptr("A", A);
  copy_into("A", A, AL, 5);
  unreg("A", A);
  reg("A", A, AL, cudaHostRegisterReadOnly);
  getflags("A", A);
  ptrattr("A", A);
  copy_from("A", A, AL, 6);
  unreg("A", A);
  reg("A", A, AL, cudaHostRegisterPortable | cudaHostRegisterMapped);
  getflags("A", A);
  unreg("A", A);
  reg("A", A, AL, 0);                  // back to the default flags after all that
  getflags("A", A);
  copy_from("A", A, AL, 7);
  unreg("A", A);
  reg("A", A, AL, 0x40);               // an undefined flag bit
  unreg("A", A);

  // --- sub-ranges, adjacent and overlapping ranges
  reg("A+4p/4p", A + 4 * P, 4 * P, 0);  // a sub-range of what was registered before
  ptrattr("A+4p", A + 4 * P);
  ptrattr("A", A, true);                // A itself was unregistered (step 44)
  copy_from("A+4p/4p", A + 4 * P, 4 * P, 8);
  reg("A", A, AL, 0);                   // 712: covers the sub-range
  unreg("A+4p", A + 4 * P);
  reg("A", A, AL, 0);
  copy_from("A", A, AL, 9);
  unreg("A", A);
  reg("A", A, AL, 0);
  reg("A+16p", A + 16 * P, AL, 0);      // adjacent: 0
  copy_from("A+16p", A + 16 * P, AL, 10);
  unreg("A", A);
  unreg("A+16p", A + 16 * P);
  reg("A", A, AL, 0);
  reg("A+8p", A + 8 * P, AL, 0);        // 712 overlapping
  unreg("A", A);
  reg("A+8p", A + 8 * P, AL, 0);        // 0 now
  copy_from("A+8p", A + 8 * P, AL, 11);
  ptrattr("A", A, true);                // A's first 8 pages: no longer registered
  ptrattr("A+8p", A + 8 * P);
  unreg("A+8p", A + 8 * P);
  reg("A/32p", A, 32 * P, 0);           // the whole allocation
  copy_from("A/32p", A, 32 * P, 12);
  unreg("A", A);

  // --- unaligned malloc(1000) buffers, one at a time
  for (int i = 0; i < 3; ++i) {
    std::string n = "m1000_" + std::to_string(i);
    unsigned char* m = static_cast<unsigned char*>(std::malloc(1000));
    reg(n, m, 1000, 0);
    ptrattr(n, m);
    copy_from(n, m, 1000, 20 + i);
    copy_into(n, m, 1000, 30 + i);
    unreg(n, m);
    copy_from(n + "_pageable", m, 1000, 40 + i);
    std::free(m);
  }
  // Sub-page ranges carved from one page-aligned block: x and y share page 0;
  // z straddles pages 0 and 1.
  unsigned char* S = static_cast<unsigned char*>(tapp::alloc_aligned(3 * P));
  unsigned char *x = S + 100, *y = S + 1200, *z = S + 4000;
  reg("x", x, 1000, 0);
  reg("y", y, 1000, 0);                 // same page as x
  copy_from("x", x, 1000, 50);
  unreg("x", x);
  unreg("y", y);
  reg("y", y, 1000, 0);
  copy_from("y", y, 1000, 51);
  unreg("y", y);
  reg("z", z, 1000, 0);
  copy_from("z", z, 1000, 52);
  reg("S+4096", S + P, P, 0);           // overlaps z's second page
  unreg("z", z);
  reg("S+4096", S + P, P, 0);
  unreg("S+4096", S + P);
  std::free(S);

  // --- pageable copies
  unsigned char* B = static_cast<unsigned char*>(tapp::alloc_aligned(kScratch));
  copy_from("B_pageable", B, kScratch, 60);
  copy_into("B_pageable", B, kScratch, 61);
  ptrattr("B", B);
  getflags("B", B);
  devptr("B", B);
  unreg("B", B);                        // never registered: 713
  reg("B", B, kScratch, 0);
  copy_from("B", B, kScratch, 62);
  unreg("B", B);
  std::free(B);

  // --- free / munmap and a new allocation at a possibly reused address
  {
    unsigned char* big = static_cast<unsigned char*>(std::malloc(kScratch));  // mmap'd chunk
    reg("big", big, kScratch, 0);
    copy_from("big", big, kScratch, 70);
    unreg("big", big);
    void* old = big;
    std::free(big);
    big = static_cast<unsigned char*>(std::malloc(kScratch));
    std::fprintf(stderr, "diffseq: malloc 1M reused address: %d\n", old == big);
    reg("big2", big, kScratch, 0);
    ptrattr("big2", big);
    copy_from("big2", big, kScratch, 71);
    unreg("big2", big);
    std::free(big);

    unsigned char* h = static_cast<unsigned char*>(tapp::alloc_aligned(8 * P));  // heap
    reg("heap8p", h, 8 * P, 0);
    copy_from("heap8p", h, 8 * P, 72);
    unreg("heap8p", h);
    old = h;
    std::free(h);
    h = static_cast<unsigned char*>(tapp::alloc_aligned(8 * P));
    std::fprintf(stderr, "diffseq: posix_memalign 32K reused address: %d\n", old == h);
    reg("heap8p_2", h, 8 * P, 0);
    copy_from("heap8p_2", h, 8 * P, 73);
    unreg("heap8p_2", h);
    std::free(h);

    unsigned char* mm = static_cast<unsigned char*>(map_anon(16 * P));
    reg("mmap16p", mm, 16 * P, 0);
    copy_from("mmap16p", mm, 16 * P, 74);
    unreg("mmap16p", mm);
    old = mm;
    munmap(mm, 16 * P);
    mm = static_cast<unsigned char*>(map_anon(16 * P));
    std::fprintf(stderr, "diffseq: mmap 64K reused address: %d\n", old == mm);
    reg("mmap16p_2", mm, 16 * P, 0);
    copy_from("mmap16p_2", mm, 16 * P, 75);
    unreg("mmap16p_2", mm);
    // Replace the pages under the same address with MAP_FIXED.
    reg("mmap16p_2", mm, 16 * P, 0);
    copy_from("mmap16p_2", mm, 16 * P, 76);
    unreg("mmap16p_2", mm);
    void* fx = mmap(mm, 16 * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (fx != mm) {
      std::perror("mmap MAP_FIXED");
      return 1;
    }
    reg("mmap16p_fixed", mm, 16 * P, 0);
    copy_from("mmap16p_fixed", mm, 16 * P, 77);
    unreg("mmap16p_fixed", mm);
    munmap(mm, 16 * P);
  }

  // --- memory that CUDA allocated
  {
    void* ph = nullptr;
    step("mallochost 64K", cudaMallocHost(&ph, 16 * P));
    getflags("mallochost", ph);
    ptrattr("mallochost", ph);
    reg("mallochost", ph, 16 * P, 0);
    unreg("mallochost", ph);
    copy_from("mallochost", ph, 16 * P, 80);
    step("freehost", cudaFreeHost(ph));
    void* ha = nullptr;
    step("hostalloc 64K portable|mapped",
         cudaHostAlloc(&ha, 16 * P, cudaHostAllocPortable | cudaHostAllocMapped));
    getflags("hostalloc", ha);
    devptr("hostalloc", ha);
    copy_into("hostalloc", ha, 16 * P, 81);
    step("freehost", cudaFreeHost(ha));
  }

  // --- context teardown with a registration alive
  reg("A", A, AL, 0);
  copy_from("A", A, AL, 90);
  step("devicereset", cudaDeviceReset());
  ptrattr("A", A, true);
  getflags("A", A, true);
  unreg("A", A);
  CHECK(cudaMalloc(&g_dev, kScratch));  // the reset freed the old scratch
  reg("A", A, AL, 0);
  ptrattr("A", A);
  copy_from("A", A, AL, 91);
  unreg("A", A);
  // And once more with the registration deferred-able: register, unregister,
  // reset, register again.
  reg("A", A, AL, 0);
  unreg("A", A);
  step("devicereset", cudaDeviceReset());
  CHECK(cudaMalloc(&g_dev, kScratch));
  reg("A", A, AL, 0);
  ptrattr("A", A);
  copy_from("A", A, AL, 92);
  unreg("A", A);

  CHECK(cudaFree(g_dev));
  std::free(g_check);
  std::free(A);
  std::printf("DONE steps=%d\n", g_step);
  return 0;
}
