// torture.cc: random mixes of host-memory life-cycle events and CUDA
// registrations, from several threads, with every return code checked against
// what the driver semantics imply and every copy verified.
//
// Each thread owns --slots slots; a slot holds one allocation whose
// registerable range is exclusive to it (whole pages no other buffer shares):
//   malloc      malloc(n) (n >= 2 pages); the range is its interior whole pages
//   memalign    posix_memalign(4096, n); the range is the whole buffer
//   mmap        mmap(MAP_ANONYMOUS) of n bytes; the whole mapping
// Random ops: allocate; cudaHostRegister (expect 0); register again while
// registered (expect 712); cudaHostUnregister (expect 0); unregister of memory
// not registered (expect 713); stamp a new pattern, cudaMemcpy H2D, cudaMemcpy
// D2H into a check buffer and compare; free / munmap (unregistering first when
// registered); realloc; mremap(MAYMOVE); mmap(MAP_FIXED) over the same address;
// munmap + mmap(MAP_FIXED_NOREPLACE) at the same address; madvise(MADV_DONTNEED)
// of a registered-then-unregistered buffer, then re-register and copy. Before
// and after the threads run, the main thread alone does an sbrk phase (grow the
// heap, register / copy / unregister the new pages, shrink it, grow again,
// register / copy / unregister) if sbrk works and nobody else moved the break.
// Every memory-release path is thus preceded by an unregister the program did,
// so a lazypin that defers unregisters must invalidate its pool on each of them
// or the later register / copy / verify catches it (on the GPU; the simulator
// copies by virtual address).
//
// CLI: torture [--threads 4] [--seconds 2] [--ops N (per thread; overrides
//              --seconds)] [--seed 1] [--slots 6] [--max-kib 1024] [--quick]
//   --quick  --seconds 0.3
// Prints a final line
//   TORTURE ops=<n> registers=<n> unregisters=<n> copies=<n> frees=<n> munmaps=<n>
//           reallocs=<n> mremaps=<n> fixed=<n> remaps=<n> madvises=<n> sbrks=<n>
//           expected_errors=<n> ok
// Exit: 0 ok; 3 on a return code other than expected ("UNEXPECTED ..."); 2 on a
// data mismatch ("DATA MISMATCH ..."); 1 on a setup failure.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common.h"

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

namespace {

const char* kUsage =
    "usage: torture [--threads 4] [--seconds 2] [--ops N] [--seed 1] [--slots 6] [--max-kib 1024] [--quick]\n";

const size_t P = tapp::kPage;

std::atomic<unsigned long long> c_ops{0}, c_reg{0}, c_unreg{0}, c_copy{0}, c_free{0}, c_munmap{0},
    c_realloc{0}, c_mremap{0}, c_fixed{0}, c_remap{0}, c_madvise{0}, c_sbrk{0}, c_experr{0};

enum Kind { NONE = 0, MALLOC, MEMALIGN, MMAP };
const char* kind_name(Kind k) {
  switch (k) {
    case MALLOC: return "malloc";
    case MEMALIGN: return "memalign";
    case MMAP: return "mmap";
    default: return "none";
  }
}

struct Slot {
  Kind kind = NONE;
  unsigned char* base = nullptr;  // what the allocator returned
  size_t size = 0;                // allocation size
  unsigned char* rp = nullptr;    // registerable range
  size_t rlen = 0;
  bool registered = false;
};

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
};

[[noreturn]] void unexpected(int tid, const char* op, const char* call, int want, cudaError_t got,
                             const Slot& s) {
  std::printf("UNEXPECTED thread=%d op=%s call=%s expected=%d got=%d (%s) kind=%s size=%zu rlen=%zu\n",
              tid, op, call, want, static_cast<int>(got), cudaGetErrorName(got), kind_name(s.kind),
              s.size, s.rlen);
  std::fflush(stdout);
  _exit(3);
}

[[noreturn]] void mismatch(int tid, const char* op, const Slot& s, long long off) {
  std::printf("DATA MISMATCH app=torture thread=%d op=%s kind=%s size=%zu rlen=%zu offset=%lld\n",
              tid, op, kind_name(s.kind), s.size, s.rlen, off);
  std::fflush(stdout);
  _exit(2);
}

[[noreturn]] void sysfail(const char* what) {
  std::perror(what);
  _exit(1);
}

void set_range(Slot& s) {
  if (s.kind == MALLOC) {
    uintptr_t b = reinterpret_cast<uintptr_t>(s.base);
    uintptr_t lo = (b + P - 1) / P * P, hi = (b + s.size) / P * P;
    s.rp = reinterpret_cast<unsigned char*>(lo);
    s.rlen = hi > lo ? hi - lo : 0;
  } else {
    s.rp = s.base;
    s.rlen = s.size;
  }
}

struct Worker {
  int tid;
  Rng rng;
  std::vector<Slot> slots;
  unsigned char* dev = nullptr;
  unsigned char* check = nullptr;
  size_t max_bytes;
  uint64_t stamp = 0;

  Worker(int t, uint64_t seed, int nslots, size_t maxb)
      : tid(t), rng(seed * 1000 + static_cast<uint64_t>(t)), slots(nslots), max_bytes(maxb) {}

  void expect(const char* op, const char* call, cudaError_t got, cudaError_t want, const Slot& s) {
    if (got != want) unexpected(tid, op, call, static_cast<int>(want), got, s);
    if (want != cudaSuccess) {
      c_experr++;
      cudaGetLastError();  // the expected error is not sticky; clear it
    }
  }

  void do_register(const char* op, Slot& s) {
    expect(op, "cudaHostRegister", cudaHostRegister(s.rp, s.rlen, 0), cudaSuccess, s);
    s.registered = true;
    c_reg++;
  }
  void do_unregister(const char* op, Slot& s) {
    expect(op, "cudaHostUnregister", cudaHostUnregister(s.rp), cudaSuccess, s);
    s.registered = false;
    c_unreg++;
  }
  void copy_verify(const char* op, Slot& s) {
    tapp::stamp_pages(s.rp, s.rlen, static_cast<uint64_t>(tid) + 77, ++stamp);
    expect(op, "cudaMemcpy H2D", cudaMemcpy(dev, s.rp, s.rlen, cudaMemcpyHostToDevice), cudaSuccess, s);
    expect(op, "cudaMemcpy D2H", cudaMemcpy(check, dev, s.rlen, cudaMemcpyDeviceToHost), cudaSuccess, s);
    long long off = tapp::first_diff(s.rp, check, s.rlen);
    if (off >= 0) mismatch(tid, op, s, off);
    c_copy++;
  }
  // Register (if needed), copy and verify, and unregister: leaves the slot
  // "registered-then-unregistered", the state a deferring lazypin keeps pooled.
  void cycle(const char* op, Slot& s) {
    if (!s.registered) do_register(op, s);
    copy_verify(op, s);
    do_unregister(op, s);
  }

  size_t rand_size() {
    size_t max_pages = std::max<size_t>(2, max_bytes / P);
    return (2 + rng.below(max_pages - 1)) * P;  // 2 .. max_pages pages
  }

  void alloc(Slot& s) {
    size_t n = rand_size();
    Kind k = static_cast<Kind>(1 + rng.below(3));
    s = Slot();
    s.kind = k;
    if (k == MALLOC) {
      n += rng.below(P);  // unaligned size
      s.base = static_cast<unsigned char*>(std::malloc(n));
      if (!s.base) sysfail("malloc");
    } else if (k == MEMALIGN) {
      void* p = nullptr;
      if (posix_memalign(&p, P, n) != 0) sysfail("posix_memalign");
      s.base = static_cast<unsigned char*>(p);
    } else {
      void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) sysfail("mmap");
      s.base = static_cast<unsigned char*>(p);
    }
    s.size = n;
    set_range(s);
    std::memset(s.base, static_cast<int>(rng.below(256)), n);
  }

  void release(Slot& s) {
    if (s.registered) do_unregister("free", s);
    if (s.kind == MMAP) {
      if (munmap(s.base, s.size) != 0) sysfail("munmap");
      c_munmap++;
    } else {
      std::free(s.base);
      c_free++;
    }
    s = Slot();
  }

  void op_realloc(Slot& s) {
    if (s.registered) do_unregister("realloc", s);
    size_t n = rand_size() + rng.below(P);
    unsigned char* p = static_cast<unsigned char*>(std::realloc(s.base, n));
    if (!p) sysfail("realloc");
    s.base = p;
    s.size = n;
    set_range(s);
    c_realloc++;
    do_register("realloc", s);
    copy_verify("realloc", s);
  }

  void op_mremap(Slot& s) {
    cycle("mremap", s);
    size_t n = rand_size();
    void* p = mremap(s.base, s.size, n, MREMAP_MAYMOVE);
    if (p == MAP_FAILED) sysfail("mremap");
    s.base = static_cast<unsigned char*>(p);
    s.size = n;
    set_range(s);
    c_mremap++;
    do_register("mremap", s);
    copy_verify("mremap", s);
  }

  void op_fixed(Slot& s) {  // new pages under the same address, atomically
    cycle("mmap_fixed", s);
    void* p = mmap(s.base, s.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p != s.base) sysfail("mmap MAP_FIXED");
    c_fixed++;
    do_register("mmap_fixed", s);
    copy_verify("mmap_fixed", s);
  }

  void op_remap(Slot& s) {  // munmap, then map the same address again if still free
    cycle("munmap_remap", s);
    if (munmap(s.base, s.size) != 0) sysfail("munmap");
    c_munmap++;
    void* p = mmap(s.base, s.size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED || p != s.base) {
      if (p != MAP_FAILED) munmap(p, s.size);  // old kernels treat the flag as a hint
      p = mmap(nullptr, s.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) sysfail("mmap");
    }
    s.base = static_cast<unsigned char*>(p);
    set_range(s);
    c_remap++;
    do_register("munmap_remap", s);
    copy_verify("munmap_remap", s);
  }

  void op_madvise(Slot& s) {  // memalign or mmap: whole pages of our own
    cycle("madvise", s);
    if (madvise(s.rp, s.rlen, MADV_DONTNEED) != 0) sysfail("madvise");
    c_madvise++;
    do_register("madvise", s);
    copy_verify("madvise", s);
  }

  void run(long long ops, double seconds) {
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&dev, max_bytes + P));
    check = static_cast<unsigned char*>(tapp::alloc_aligned(max_bytes + P));
    double end = tapp::now_us() + seconds * 1e6;
    for (long long i = 0; ops > 0 ? i < ops : tapp::now_us() < end; ++i) {
      Slot& s = slots[rng.below(slots.size())];
      c_ops++;
      if (s.kind == NONE) {
        alloc(s);
        continue;
      }
      unsigned r = static_cast<unsigned>(rng.below(100));
      if (r < 20) {
        if (s.registered) do_unregister("unregister", s);
        else do_register("register", s);
      } else if (r < 24) {
        if (s.registered)
          expect("register_again", "cudaHostRegister", cudaHostRegister(s.rp, s.rlen, 0),
                 cudaErrorHostMemoryAlreadyRegistered, s);
        else
          expect("unregister_again", "cudaHostUnregister", cudaHostUnregister(s.rp),
                 cudaErrorHostMemoryNotRegistered, s);
      } else if (r < 50) {
        copy_verify("copy", s);
      } else if (r < 62) {
        release(s);
      } else if (r < 70) {
        if (s.kind == MALLOC) op_realloc(s);
        else if (s.kind == MMAP) op_mremap(s);
        else cycle("cycle", s);
      } else if (r < 78) {
        if (s.kind == MMAP) op_fixed(s);
        else cycle("cycle", s);
      } else if (r < 86) {
        if (s.kind == MMAP) op_remap(s);
        else release(s);
      } else if (r < 94) {
        if (s.kind != MALLOC) op_madvise(s);
        else cycle("cycle", s);
      } else {
        cycle("cycle", s);
      }
    }
    for (Slot& s : slots)
      if (s.kind != NONE) release(s);
    CHECK(cudaFree(dev));
    std::free(check);
  }
};

// Main thread only, no other thread running. Returns the number of sbrk cycles done.
int sbrk_phase(unsigned char* dev, unsigned char* check) {
  const size_t pages = 16, want = pages * P;
  int done = 0;
  Worker w(-1, 1, 1, want);  // constructed (and its malloc done) before the break moves
  w.dev = dev;
  w.check = check;
  for (int round = 0; round < 2; ++round) {
    void* cur = sbrk(0);
    if (cur == reinterpret_cast<void*>(-1)) return done;
    uintptr_t c = reinterpret_cast<uintptr_t>(cur);
    size_t pad = (P - c % P) % P;
    void* got = sbrk(static_cast<intptr_t>(pad + want));
    if (got == reinterpret_cast<void*>(-1)) return done;
    unsigned char* rp = reinterpret_cast<unsigned char*>(c + pad);
    Slot s;
    s.kind = MEMALIGN;
    s.base = rp;
    s.size = want;
    s.rp = rp;
    s.rlen = want;
    std::memset(rp, 0x33, want);
    w.cycle("sbrk", s);
    c_sbrk++;
    ++done;
    if (sbrk(0) != reinterpret_cast<void*>(c + pad + want)) return done;  // someone moved it: keep it
    if (sbrk(-static_cast<intptr_t>(pad + want)) == reinterpret_cast<void*>(-1)) return done;
  }
  return done;
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"threads", "seconds", "ops", "seed", "slots", "max-kib"}, {"quick"},
                  kUsage);
  const bool quick = args.has("quick");
  const int T = static_cast<int>(args.num("threads", 4));
  const double seconds = args.real("seconds", quick ? 0.3 : 2.0);
  const long long ops = args.num("ops", 0);
  const uint64_t seed = static_cast<uint64_t>(args.num("seed", 1));
  const int nslots = static_cast<int>(args.num("slots", 6));
  const size_t max_bytes = static_cast<size_t>(args.num("max-kib", 1024)) * 1024;
  if (T < 1 || nslots < 1 || max_bytes < 2 * P || (ops <= 0 && seconds <= 0)) args.die("bad arguments");

  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  unsigned char* dev = nullptr;
  CHECK(cudaMalloc(&dev, 64 * P));
  unsigned char* check = static_cast<unsigned char*>(tapp::alloc_aligned(64 * P));

  sbrk_phase(dev, check);
  std::vector<std::thread> th;
  std::vector<Worker*> ws;
  for (int t = 0; t < T; ++t) ws.push_back(new Worker(t, seed, nslots, max_bytes));
  for (int t = 0; t < T; ++t) th.emplace_back([&, t] { ws[t]->run(ops, seconds); });
  for (auto& x : th) x.join();
  for (Worker* w : ws) delete w;
  sbrk_phase(dev, check);

  CHECK(cudaFree(dev));
  std::free(check);
  std::printf("TORTURE ops=%llu registers=%llu unregisters=%llu copies=%llu frees=%llu munmaps=%llu "
              "reallocs=%llu mremaps=%llu fixed=%llu remaps=%llu madvises=%llu sbrks=%llu "
              "expected_errors=%llu ok\n",
              c_ops.load(), c_reg.load(), c_unreg.load(), c_copy.load(), c_free.load(), c_munmap.load(),
              c_realloc.load(), c_mremap.load(), c_fixed.load(), c_remap.load(), c_madvise.load(),
              c_sbrk.load(), c_experr.load());
  return 0;
}
