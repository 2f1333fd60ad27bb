// prefault: pages faulted in by several threads, contents unchanged, and only
// where a writable register of private anonymous memory would do the same.
#include "prefault.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
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
  const int chunks = PrefaultRange(lo, lo + bytes, 4);
  if (chunks == 0) GTEST_SKIP() << "the kernel has no MADV_POPULATE_WRITE";
  EXPECT_EQ(chunks, 4);
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
  EXPECT_EQ(PrefaultRange(r, r + big, 4), 0);  // each chunk fails; nothing crashes
  munmap(ro, big);
}

}  // namespace
}  // namespace lazypin
