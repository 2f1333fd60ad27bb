// hammer.cc: many threads hammering register / unregister / copy / free / munmap
// on SHARED buffers (and one private buffer each), for a bounded time.
//
// Shared buffers: any thread may register or unregister any of them at any
// time (shared lock), so codes race: a register must give 0 or 712, an
// unregister 0 or 713. Balance is checked whenever a thread takes a buffer
// exclusively (to copy+verify or to release it): successful registers minus
// successful unregisters must be 0 or 1, and the driver must agree (an
// unregister then gives 0 exactly when it is 1). Releases: free, munmap,
// munmap + mmap at the same address, mmap(MAP_FIXED) over it.
// Private buffers: codes are exact (0, 712, 0, 713).
//
// CLI: hammer [--threads 32] [--seconds 10] [--buffers 16] [--seed 1]
// Prints "HAMMER threads=.. ops=.. ... ok". Exit 0 ok, 2 data mismatch,
// 3 unexpected code or balance.
#include "hcommon.h"

#include <sys/mman.h>

#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

namespace {

struct Shared {
  std::shared_mutex lock;
  unsigned char* p = nullptr;
  size_t n = 0;
  bool mapped = false;  // mmap'd (else malloc'd)
  std::atomic<long> regs{0}, unregs{0};
};

std::atomic<unsigned long long> c_ops{0}, c_reg{0}, c_unreg{0}, c_712{0}, c_713{0}, c_copy{0},
    c_release{0}, c_private{0};

struct Rng {
  unsigned long long s;
  unsigned next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<unsigned>(s >> 11);
  }
};

void alloc_shared(Shared& b, Rng& r) {
  b.n = (16 + r.next() % 112) * hard::kPage;  // 64 KiB .. 512 KiB
  b.mapped = r.next() % 2;
  if (b.mapped) {
    void* m = mmap(nullptr, b.n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("mmap"); std::_Exit(1); }
    b.p = static_cast<unsigned char*>(m);
  } else {
    void* m = nullptr;
    if (posix_memalign(&m, hard::kPage, b.n)) { perror("posix_memalign"); std::_Exit(1); }
    b.p = static_cast<unsigned char*>(m);
  }
  std::memset(b.p, 0, b.n);
}

// Balance check with the buffer held exclusively; returns whether it is registered.
bool balanced_registered(Shared& b) {
  long d = b.regs.load() - b.unregs.load();
  if (d != 0 && d != 1) {
    std::fprintf(stderr, "UNBALANCED buffer %p: registers - unregisters = %ld\n", (void*)b.p, d);
    std::_Exit(3);
  }
  return d == 1;
}

void exclusive_copy(Shared& b, void* dev, unsigned char* check, unsigned seed) {
  if (!balanced_registered(b)) {
    EXPECT(cudaHostRegister(b.p, b.n, 0), 0);
    b.regs++;
    c_reg++;
  }
  hard::roundtrip(b.p, b.n, dev, check, seed);
  c_copy++;
  EXPECT(cudaHostUnregister(b.p), 0);
  b.unregs++;
  c_unreg++;
}

void exclusive_release(Shared& b, Rng& r) {
  if (balanced_registered(b)) {
    EXPECT(cudaHostUnregister(b.p), 0);
    b.unregs++;
    c_unreg++;
  }
  unsigned how = r.next() % 4;
  if (!b.mapped || how == 0) {
    if (b.mapped) munmap(b.p, b.n); else std::free(b.p);
    alloc_shared(b, r);
  } else if (how == 1) {  // munmap, then map again at the same address
    munmap(b.p, b.n);
    void* m = mmap(b.p, b.n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (m == MAP_FAILED) alloc_shared(b, r); else b.p = static_cast<unsigned char*>(m);
  } else {  // new pages over the same range
    void* m = mmap(b.p, b.n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (m == MAP_FAILED) { perror("mmap fixed"); std::_Exit(1); }
  }
  c_release++;
}

void worker(int id, std::vector<Shared>* bufs, double deadline) {
  Rng r{0x9E3779B97F4A7C15ull * static_cast<unsigned long long>(id + 1)};
  void* dev = nullptr;
  EXPECT(cudaMalloc(&dev, 512 * hard::kPage), 0);
  std::vector<unsigned char> check(512 * hard::kPage);
  size_t pn = (8 + r.next() % 32) * hard::kPage;
  unsigned char* priv = static_cast<unsigned char*>(std::malloc(pn + hard::kPage));
  unsigned long long ops = 0;
  while (hard::now_s() < deadline) {
    for (int k = 0; k < 16; ++k, ++ops) {
      Shared& b = (*bufs)[r.next() % bufs->size()];
      unsigned op = r.next() % 100;
      if (op < 40) {
        std::shared_lock<std::shared_mutex> l(b.lock);
        int rc = cudaHostRegister(b.p, b.n, 0);
        if (rc == 0) { b.regs++; c_reg++; }
        else if (rc == 712) { c_712++; cudaGetLastError(); }
        else hard::expect(rc, 0, "shared cudaHostRegister", __LINE__);
      } else if (op < 80) {
        std::shared_lock<std::shared_mutex> l(b.lock);
        int rc = cudaHostUnregister(b.p);
        if (rc == 0) { b.unregs++; c_unreg++; }
        else if (rc == 713) { c_713++; cudaGetLastError(); }
        else hard::expect(rc, 0, "shared cudaHostUnregister", __LINE__);
      } else if (op < 88) {
        std::unique_lock<std::shared_mutex> l(b.lock);
        exclusive_copy(b, dev, check.data(), r.next());
      } else if (op < 94) {
        std::unique_lock<std::shared_mutex> l(b.lock);
        exclusive_release(b, r);
      } else {  // the private buffer: exact codes
        unsigned char* p = reinterpret_cast<unsigned char*>(
            (reinterpret_cast<uintptr_t>(priv) + hard::kPage - 1) & ~(hard::kPage - 1));
        EXPECT(cudaHostRegister(p, pn, 0), 0);
        EXPECT(cudaHostRegister(p, pn, 0), 712);
        cudaGetLastError();
        hard::roundtrip(p, pn, dev, check.data(), r.next());
        EXPECT(cudaHostUnregister(p), 0);
        EXPECT(cudaHostUnregister(p), 713);
        cudaGetLastError();
        c_reg++; c_unreg++; c_712++; c_713++; c_copy++; c_private++;
        if (r.next() % 2) {
          std::free(priv);
          pn = (8 + r.next() % 32) * hard::kPage;
          priv = static_cast<unsigned char*>(std::malloc(pn + hard::kPage));
        }
      }
    }
  }
  std::free(priv);
  cudaFree(dev);
  c_ops += ops;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(hard::arg_double(argc, argv, "--threads", 32));
  double seconds = hard::arg_double(argc, argv, "--seconds", 10);
  int nbuf = static_cast<int>(hard::arg_double(argc, argv, "--buffers", 16));
  unsigned seed = static_cast<unsigned>(hard::arg_double(argc, argv, "--seed", 1));
  EXPECT(cudaFree(nullptr), 0);
  std::vector<Shared> bufs(nbuf);
  Rng r{seed * 2654435761ull + 1};
  for (auto& b : bufs) alloc_shared(b, r);
  double deadline = hard::now_s() + seconds;
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; ++i) ts.emplace_back(worker, i, &bufs, deadline);
  for (auto& t : ts) t.join();
  // Final balance: the driver must agree with the program's own count.
  for (auto& b : bufs) {
    bool reg = balanced_registered(b);
    EXPECT(cudaHostUnregister(b.p), reg ? 0 : 713);
    cudaGetLastError();
    if (b.mapped) munmap(b.p, b.n); else std::free(b.p);
  }
  std::printf("HAMMER threads=%d buffers=%d ops=%llu registers=%llu unregisters=%llu "
              "already=%llu notreg=%llu copies=%llu releases=%llu private=%llu ok\n",
              threads, nbuf, c_ops.load(), c_reg.load(), c_unreg.load(), c_712.load(),
              c_713.load(), c_copy.load(), c_release.load(), c_private.load());
  return 0;
}
