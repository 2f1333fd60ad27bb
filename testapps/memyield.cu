// memyield: a program that gives memory back and then needs it. It makes
// `--keep` bytes of one kind that a caching layer might hold on to after the
// program let go of them, lets go of them, and then uses `--demand` bytes of
// new memory. Run in a memory cgroup whose limit leaves room for the demand
// but not for both: bare it survives, so it must under any layer below it.
// Knows nothing of lazypin.
//
//   memyield --kind hostcache --keep 450M --demand 1600M --how malloc
//     --kind    hostcache: cudaMallocHost, touch, cudaFreeHost
//               reuse:     malloc, touch, cudaHostRegister, cudaHostUnregister, free
//               autopin:   malloc, touch, cudaMemcpy to the device, free
//               none:      nothing given back (the demand alone)
//     --how     malloc:   malloc and touch the demand in --piece pieces (64M)
//               populate: one mmap(MAP_POPULATE) of the whole demand
//               touch:    mmap the demand before giving back, touch it after
//                         (growth that no allocation call announces)
//               small:    malloc and touch it in 64 KiB pieces
//     --cycles  give back and take again this many times (1)
// Prints "kept", then "demand done", then "OK"; exit 0.
#include <sys/mman.h>

#include "common.h"

namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "memyield: %s\n", what);
  std::exit(1);
}

void Touch(void* p, size_t n) {
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; i += 4096) b[i] = static_cast<unsigned char>(i >> 12 | 1);
  if (n != 0) b[n - 1] = 1;
}

// Makes `bytes` of `kind`, touches them and lets go of them.
void GiveBack(const std::string& kind, size_t bytes) {
  if (kind == "none" || bytes == 0) return;
  if (kind == "hostcache") {
    void* p = nullptr;
    CHECK(cudaMallocHost(&p, bytes));
    Touch(p, bytes);
    CHECK(cudaFreeHost(p));
    return;
  }
  void* p = std::malloc(bytes);
  if (p == nullptr) Die("malloc of the kept block failed");
  Touch(p, bytes);
  if (kind == "reuse") {
    CHECK(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
    CHECK(cudaHostUnregister(p));
  } else if (kind == "autopin") {
    void* d = nullptr;
    CHECK(cudaMalloc(&d, bytes));
    CHECK(cudaMemcpy(d, p, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaFree(d));
  } else {
    Die("--kind is hostcache, reuse, autopin or none");
  }
  std::free(p);
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"kind", "keep", "demand", "how", "piece", "cycles"}, {},
                  "memyield --kind K --keep BYTES --demand BYTES --how H [--piece 64M] [--cycles N]\n");
  const std::string kind = args.str("kind", "hostcache");
  const std::string how = args.str("how", "malloc");
  const size_t keep = args.size("keep", 0);
  const size_t demand = args.size("demand", 0);
  const size_t piece = args.size("piece", size_t{64} << 20);
  if (piece == 0) Die("--piece must not be 0");
  const long long cycles = args.num("cycles", 1);
  CHECK(cudaFree(nullptr));  // CUDA set up first, as a real program would
  void* premapped = nullptr;
  if (how == "touch") {
    premapped = mmap(nullptr, demand, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (premapped == MAP_FAILED) Die("mmap failed");
  }
  for (long long c = 0; c < cycles; ++c) GiveBack(kind, keep);
  std::printf("kept\n");
  std::fflush(stdout);
  std::vector<void*> pieces;
  const double t0 = tapp::now_us();
  if (how == "malloc" || how == "small") {
    const size_t step = how == "small" ? size_t{64} << 10 : piece;
    for (size_t done = 0; done < demand; done += step) {
      const size_t n = std::min(step, demand - done);
      void* p = std::malloc(n);
      if (p == nullptr) Die("malloc of the demand failed");
      Touch(p, n);
      pieces.push_back(p);
    }
  } else if (how == "populate") {
    void* p = mmap(nullptr, demand, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) Die("mmap(MAP_POPULATE) failed");
    pieces.push_back(p);
  } else if (how == "touch") {
    for (size_t done = 0; done < demand; done += piece) {
      Touch(static_cast<char*>(premapped) + done, std::min(piece, demand - done));
    }
  } else {
    Die("--how is malloc, populate, touch or small");
  }
  // The rate the demand grew at (stderr: the output is compared bare vs under a layer).
  std::fprintf(stderr, "memyield: demand at %.2f GB/s\n", demand / (tapp::now_us() - t0) / 1e3);
  std::printf("demand done\n");
  std::printf("OK\n");
  return 0;
}
