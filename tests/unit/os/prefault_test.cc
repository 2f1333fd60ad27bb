// prefault: pages faulted in by several threads, contents unchanged, and only
// where a writable register of private anonymous memory would do the same;
// the planner's threads, affinity and NUMA placement; huge pages.
#include "prefault.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lazypin {
namespace {

size_t Resident(void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  if (mincore(p, bytes, vec.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n * page;
}

TEST(PrefaultTest, FaultsEveryPageInAndKeepsTheContents) {
  const size_t bytes = kPrefaultMinBytes + (3 << 20) + 4096;  // not a multiple of the chunks
  auto* p = static_cast<unsigned char*>(
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  for (size_t at = 0; at < bytes; at += size_t{5} << 20) p[at] = static_cast<unsigned char>(at >> 20);
  const auto lo = reinterpret_cast<uintptr_t>(p);
  ASSERT_TRUE(ShouldPrefault(lo, lo + bytes, 0, 4));
  const PrefaultResult r = PrefaultRange(lo, lo + bytes, PrefaultOptions{4, false});
  ASSERT_TRUE(r.touched);
  EXPECT_GE(r.threads, 1);
  EXPECT_LE(r.threads, std::min<int>(4, static_cast<int>(ReadPrefaultMachine().cpus.size())));
  EXPECT_EQ(r.slices_ok, r.threads);
  EXPECT_EQ(Resident(p, bytes), bytes);
  for (size_t at = 0; at < bytes; ++at) {
    const unsigned char want = at % (size_t{5} << 20) == 0 ? static_cast<unsigned char>(at >> 20) : 0;
    if (p[at] != want) {
      ADD_FAILURE() << "byte " << at << " changed";
      break;
    }
  }
  munmap(p, bytes);
}

TEST(PrefaultTest, OnlyLargeWritablePrivateAnonymousMemory) {
  const size_t big = kPrefaultMinBytes;
  void* anon = mmap(nullptr, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* shared = mmap(nullptr, big, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(anon, MAP_FAILED);
  ASSERT_NE(shared, MAP_FAILED);
  const auto a = reinterpret_cast<uintptr_t>(anon);
  const auto s = reinterpret_cast<uintptr_t>(shared);
  EXPECT_TRUE(ShouldPrefault(a, a + big, 0, 4));
  EXPECT_FALSE(ShouldPrefault(a, a + big - 4096, 0, 4));  // below the threshold
  EXPECT_FALSE(ShouldPrefault(a, a + big, 0x08, 4));      // READ_ONLY: the pin does not write
  EXPECT_FALSE(ShouldPrefault(a, a + big, 0x04, 4));      // IOMEMORY
  EXPECT_FALSE(ShouldPrefault(a, a + big, 0x40, 4));      // a flag the driver refuses
  EXPECT_FALSE(ShouldPrefault(a, a + big, 0, 1));         // one thread: the driver's own way
  EXPECT_FALSE(ShouldPrefault(s, s + big, 0, 4));         // shared: no private copy is made
  EXPECT_EQ(Resident(anon, big), 0u);                     // deciding touched nothing
  munmap(anon, big);
  munmap(shared, big);
}

TEST(PrefaultTest, NothingForARangeTheDriverWouldRefuse) {
  // One PROT_NONE (or read-only) page anywhere: the register fails, and
  // nothing may be faulted in for it (past that page the driver never goes).
  const size_t big = 2 * kPrefaultMinBytes;
  for (int prot : {PROT_NONE, PROT_READ}) {
    void* anon = mmap(nullptr, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(anon, MAP_FAILED);
    const auto a = reinterpret_cast<uintptr_t>(anon);
    ASSERT_EQ(mprotect(static_cast<char*>(anon) + big / 4, 4096, prot), 0);
    EXPECT_FALSE(ShouldPrefault(a, a + big, 0, 4)) << prot;
    EXPECT_TRUE(ShouldPrefault(a + big / 2, a + big, 0, 4)) << "the part past it is fine";
    EXPECT_EQ(Resident(anon, big), 0u);
    munmap(anon, big);
  }
}

TEST(PrefaultTest, ARangeItCannotFaultInIsLeftAsItWas) {
  const size_t big = kPrefaultMinBytes;
  void* ro = mmap(nullptr, big, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  const auto r = reinterpret_cast<uintptr_t>(ro);
  EXPECT_EQ(PrefaultRange(r, r + big, 4), 0);  // nothing is touched; nothing crashes
  munmap(ro, big);
}

TEST(PrefaultTest, AConcurrentWriterKeepsEveryByteItWrote) {
  // Each helper's write is an atomic fetch-or of 0: a byte the program
  // writes meanwhile on another thread is never written back over.
  const size_t bytes = 2 * kPrefaultMinBytes;
  auto* p = static_cast<unsigned char*>(
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::thread writer([&] {
    for (int round = 1; round <= 3; ++round) {
      for (size_t at = 0; at < bytes; at += page) {
        __atomic_store_n(&p[at], static_cast<unsigned char>(round + (at / page) % 7),
                         __ATOMIC_RELAXED);
      }
    }
  });
  const auto lo = reinterpret_cast<uintptr_t>(p);
  PrefaultRange(lo, lo + bytes, PrefaultOptions{4, false});
  writer.join();
  for (size_t at = 0; at < bytes; at += page) {
    if (p[at] != static_cast<unsigned char>(3 + (at / page) % 7)) {
      ADD_FAILURE() << "page " << at / page << " lost the writer's byte";
      break;
    }
  }
  munmap(p, bytes);
}

TEST(PrefaultTest, WithoutPopulateItTouchesOnlyWhereNoKeyCanDenyIt) {
  // A kernel before 5.14: no MADV_POPULATE_WRITE to check the caller's
  // rights with; touching is then safe only on a CPU without protection keys.
  PrefaultAssumeNoPopulateForTest(true);
  const size_t bytes = kPrefaultMinBytes;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  const auto lo = reinterpret_cast<uintptr_t>(p);
  const bool keys = CpuHasProtectionKeys();
  EXPECT_EQ(ShouldPrefault(lo, lo + bytes, 0, 4), !keys);
  const PrefaultResult r = PrefaultRange(lo, lo + bytes, PrefaultOptions{4, false});
  EXPECT_EQ(r.touched, !keys);
  EXPECT_EQ(Resident(p, bytes), keys ? 0 : bytes);
  PrefaultAssumeNoPopulateForTest(false);
  munmap(p, bytes);
}

// A machine of `cpus` CPUs, node = cpu / per_node.
PrefaultMachine Machine(int cpus, int per_node, int caller_node) {
  PrefaultMachine m;
  for (int c = 0; c < cpus; ++c) {
    m.cpus.push_back(c);
    m.nodes.push_back(per_node > 0 ? c / per_node : 0);
  }
  m.caller_node = caller_node;
  return m;
}

void ExpectCovers(const PrefaultPlan& plan, uintptr_t lo, uintptr_t hi) {
  ASSERT_FALSE(plan.slices.empty());
  EXPECT_EQ(plan.slices.front().lo, lo);
  EXPECT_EQ(plan.slices.back().hi, hi);
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    EXPECT_LT(plan.slices[i].lo, plan.slices[i].hi);
    if (i + 1 < plan.slices.size()) {
      EXPECT_EQ(plan.slices[i].hi, plan.slices[i + 1].lo);
      EXPECT_EQ(plan.slices[i].hi % kHugeBytes, 0u) << "slices end on huge-page boundaries";
    }
  }
}

constexpr uintptr_t kLo = uintptr_t{0x7f0000000000} + 4096;  // not on a huge-page boundary

TEST(PrefaultPlanTest, ThreadsAreBoundedByTheOptionTheMaskAndTheSize) {
  const uintptr_t gib = uintptr_t{1} << 30;
  EXPECT_EQ(PlanPrefault(kLo, kLo + gib, 16, Machine(16, 0, 0)).slices.size(), 16u);
  EXPECT_EQ(PlanPrefault(kLo, kLo + gib, 4, Machine(16, 0, 0)).slices.size(), 4u);
  EXPECT_EQ(PlanPrefault(kLo, kLo + gib, 16, Machine(6, 0, 0)).slices.size(), 6u) << "the mask";
  EXPECT_EQ(PlanPrefault(kLo, kLo + 64 * gib, 64, Machine(256, 0, 0)).slices.size(),
            static_cast<size_t>(kPrefaultMaxThreads));
  // At least kPrefaultMinSlice each: 64 MiB is 4 slices.
  EXPECT_EQ(PlanPrefault(kLo, kLo + kPrefaultMinBytes, 16, Machine(16, 0, 0)).slices.size(), 4u);
  EXPECT_EQ(PlanPrefault(kLo, kLo + gib, 16, Machine(1, 0, 0)).slices.size(), 1u) << "one CPU";
  EXPECT_TRUE(PlanPrefault(kLo, kLo + gib, 0, Machine(16, 0, 0)).slices.empty());
  EXPECT_TRUE(PlanPrefault(kLo, kLo + gib, 16, PrefaultMachine{}).slices.empty());
  for (int t : {1, 2, 3, 7, 16}) {
    const PrefaultPlan plan = PlanPrefault(kLo, kLo + gib + 12288, t, Machine(16, 0, 0));
    EXPECT_EQ(plan.slices.size(), static_cast<size_t>(t));
    ExpectCovers(plan, kLo, kLo + gib + 12288);
    // Contiguous and even: no slice more than one huge page over its share.
    for (const PrefaultSlice& s : plan.slices) EXPECT_LE(s.hi - s.lo, gib / t + kHugeBytes);
  }
}

TEST(PrefaultPlanTest, OneNodeLeavesPlacementToTheKernel) {
  const PrefaultPlan plan = PlanPrefault(kLo, kLo + (uintptr_t{1} << 30), 8, Machine(16, 0, 0));
  EXPECT_TRUE(plan.helper_cpus.empty());
  EXPECT_EQ(plan.prefer_node, -1);
}

TEST(PrefaultPlanTest, SeveralNodesKeepTheHelpersOnTheCallersNode) {
  const uintptr_t gib = uintptr_t{1} << 30;
  // Two nodes of 8 CPUs; the caller on node 1 with the default policy.
  PrefaultPlan plan = PlanPrefault(kLo, kLo + gib, 16, Machine(16, 8, 1));
  EXPECT_EQ(plan.slices.size(), 8u) << "the caller's node's CPUs";
  EXPECT_EQ(plan.helper_cpus, (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(plan.prefer_node, 1);
  ExpectCovers(plan, kLo, kLo + gib);
  // The mask gives node 1 one CPU only: every CPU of the mask, preferring node 1.
  PrefaultMachine m = Machine(9, 8, 1);
  plan = PlanPrefault(kLo, kLo + gib, 16, m);
  EXPECT_EQ(plan.slices.size(), 9u);
  EXPECT_TRUE(plan.helper_cpus.empty());
  EXPECT_EQ(plan.prefer_node, 1);
  // A policy of its own (interleave, bind): the helpers inherit it, anywhere.
  plan = PlanPrefault(kLo, kLo + gib, 16, Machine(16, 8, -1));
  EXPECT_EQ(plan.slices.size(), 16u);
  EXPECT_TRUE(plan.helper_cpus.empty());
  EXPECT_EQ(plan.prefer_node, -1);
}

TEST(PrefaultPlanTest, ReadsTheCallersAffinityMask) {
  // On a thread of its own limited to one CPU: one CPU in the machine, and
  // a prefault of that thread touches with that thread alone.
  std::thread([] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    const PrefaultMachine m = ReadPrefaultMachine();
    ASSERT_EQ(m.cpus.size(), 1u);
    EXPECT_EQ(m.nodes.size(), 1u);
    const size_t bytes = kPrefaultMinBytes;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    const auto lo = reinterpret_cast<uintptr_t>(p);
    const PrefaultResult r = PrefaultRange(lo, lo + bytes, PrefaultOptions{16, false});
    EXPECT_TRUE(r.touched);
    EXPECT_EQ(r.threads, 1);
    EXPECT_EQ(Resident(p, bytes), bytes);
    munmap(p, bytes);
  }).join();
  const PrefaultMachine all = ReadPrefaultMachine();
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(all.cpus.size(), static_cast<size_t>(CPU_COUNT(&set)));
}

TEST(PrefaultPlanTest, ParsesTheTransparentHugePageMode) {
  EXPECT_EQ(ParseThpMode("always [madvise] never\n"), ThpMode::kMadvise);
  EXPECT_EQ(ParseThpMode("[always] madvise never\n"), ThpMode::kAlways);
  EXPECT_EQ(ParseThpMode("always madvise [never]\n"), ThpMode::kNever);
  EXPECT_EQ(ParseThpMode(""), ThpMode::kUnknown);
}

// A fresh mapping of `bytes` starting on a huge-page boundary.
unsigned char* HugeAligned(size_t bytes, void** base, size_t* mapped) {
  *mapped = bytes + kHugeBytes;
  *base = mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (*base == MAP_FAILED) return nullptr;
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(*base) + kHugeBytes - 1) &
                                          ~(kHugeBytes - 1));
}

// AnonHugePages of the mapping holding p, from /proc/self/smaps (kB).
long AnonHugeKb(const void* p) {
  FILE* f = fopen("/proc/self/smaps", "r");
  if (f == nullptr) return -1;
  char line[512];
  bool inside = false;
  long kb = -1;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (fgets(line, sizeof(line), f) != nullptr) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      inside = a >= lo && a < hi;
    } else if (inside && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) {
      break;
    }
  }
  fclose(f);
  return kb;
}

TEST(PrefaultHugeTest, TheProgramsOwnAdviceGivesHugePagesAndNothingElseChanges) {
  const ThpMode mode = ReadThpMode();
  if (mode != ThpMode::kMadvise && mode != ThpMode::kAlways) GTEST_SKIP() << "no THP here";
  const size_t bytes = kPrefaultMinBytes;
  void* base;
  size_t mapped;
  unsigned char* p = HugeAligned(bytes, &base, &mapped);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(madvise(p, bytes, MADV_HUGEPAGE), 0);  // the program's own
  p[12345] = 7;
  const auto lo = reinterpret_cast<uintptr_t>(p);
  const PrefaultResult r = PrefaultRange(lo, lo + bytes, PrefaultOptions{4, false});
  EXPECT_TRUE(r.touched);
  EXPECT_FALSE(r.advised) << "not asked";
  EXPECT_EQ(Resident(p, bytes), bytes);
  if (!r.huge) GTEST_SKIP() << "no huge page could be had (fragmented memory)";
  EXPECT_GT(AnonHugeKb(p), 0);
  for (size_t at = 0; at < bytes; ++at) {
    if (p[at] != (at == 12345 ? 7 : 0)) {
      ADD_FAILURE() << "byte " << at << " changed";
      break;
    }
  }
  munmap(base, mapped);
}

TEST(PrefaultHugeTest, AskedForOnlyWhereTheProgramDidNotRefuse) {
  const ThpMode mode = ReadThpMode();
  if (mode != ThpMode::kMadvise && mode != ThpMode::kAlways) GTEST_SKIP() << "no THP here";
  const size_t bytes = kPrefaultMinBytes;
  for (bool refuse : {false, true}) {
    void* base;
    size_t mapped;
    unsigned char* p = HugeAligned(bytes, &base, &mapped);
    ASSERT_NE(p, nullptr);
    if (refuse) {
      ASSERT_EQ(madvise(p, bytes, MADV_NOHUGEPAGE), 0);
    }
    const auto lo = reinterpret_cast<uintptr_t>(p);
    EXPECT_EQ(HugePagesRefused(lo, lo + bytes), refuse);
    const PrefaultResult r = PrefaultRange(lo, lo + bytes, PrefaultOptions{4, true});
    EXPECT_TRUE(r.touched);
    EXPECT_EQ(r.advised, !refuse);
    EXPECT_EQ(Resident(p, bytes), bytes);
    if (refuse) {
      EXPECT_FALSE(r.huge) << "the program's MADV_NOHUGEPAGE stands";
      EXPECT_EQ(AnonHugeKb(p), 0);
    }
    munmap(base, mapped);
  }
  // Not asked, in "madvise" mode: small pages, as the program's own faults.
  if (mode == ThpMode::kMadvise) {
    void* base;
    size_t mapped;
    unsigned char* p = HugeAligned(bytes, &base, &mapped);
    ASSERT_NE(p, nullptr);
    const auto lo = reinterpret_cast<uintptr_t>(p);
    const PrefaultResult r = PrefaultRange(lo, lo + bytes, PrefaultOptions{4, false});
    EXPECT_FALSE(r.huge);
    EXPECT_FALSE(r.advised);
    EXPECT_EQ(AnonHugeKb(p), 0);
    munmap(base, mapped);
  }
}

TEST(PrefaultTest, AMappingTheCallerMayNotWriteGetsNothing) {
  // A protection key that denies this thread writes: the driver's pin fails
  // there; no helper may take a fault for it (it would be a SIGSEGV).
  const int key = static_cast<int>(syscall(SYS_pkey_alloc, 0, 0x2 /* PKEY_DISABLE_WRITE */));
  if (key < 0) GTEST_SKIP() << "no memory protection keys here";
  const size_t bytes = kPrefaultMinBytes;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(syscall(SYS_pkey_mprotect, static_cast<char*>(p) + bytes / 2, bytes / 2,
                    PROT_READ | PROT_WRITE, key), 0);
  const auto lo = reinterpret_cast<uintptr_t>(p);
  const PrefaultResult r = PrefaultRange(lo, lo + bytes, PrefaultOptions{4, false});
  EXPECT_FALSE(r.touched);
  EXPECT_LE(Resident(p, bytes), size_t{2} << 20);
  munmap(p, bytes);
  syscall(SYS_pkey_free, key);
}

}  // namespace
}  // namespace lazypin
