// Reading the process's own memory without a fault (shim/os/own_memory.h)
// and the frames behind it (shim/os/pfn.h).
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "own_memory.h"
#include "pfn.h"
#include "seccomp.h"

namespace lazypin {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// Two pages: the first readable, the second `second_prot`.
unsigned char* TwoPages(int second_prot) {
  void* p = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  memset(p, 0x5a, 2 * kPage);
  mprotect(static_cast<unsigned char*>(p) + kPage, kPage, second_prot);
  return static_cast<unsigned char*>(p);
}

TEST(ReadOwnMemory, CopiesReadableBytes) {
  if (SeccompFiltered()) GTEST_SKIP() << "under a seccomp filter it makes no call";
  unsigned char* p = TwoPages(PROT_READ);
  ASSERT_NE(p, nullptr);
  std::vector<unsigned char> out(2 * kPage);
  ASSERT_TRUE(ReadOwnMemory(out.data(), p, out.size()));
  EXPECT_EQ(memcmp(out.data(), p, out.size()), 0);
  munmap(p, 2 * kPage);
}

TEST(ReadOwnMemory, FalseWithoutAFaultWhereAnyByteCannotBeRead) {
  unsigned char* p = TwoPages(PROT_NONE);
  ASSERT_NE(p, nullptr);
  std::vector<unsigned char> out(2 * kPage);
  EXPECT_FALSE(ReadOwnMemory(out.data(), p + kPage - 8, 16)) << "across into a PROT_NONE page";
  EXPECT_FALSE(ReadOwnMemory(out.data(), p + kPage, 8)) << "inside it";
  munmap(p + kPage, kPage);
  EXPECT_FALSE(ReadOwnMemory(out.data(), p + kPage, 8)) << "unmapped";
  if (!SeccompFiltered()) EXPECT_TRUE(ReadOwnMemory(out.data(), p, 8)) << "the readable page still is";
  munmap(p, kPage);
}

TEST(MapScratch, WritableAndZeroed) {
  auto* s = static_cast<unsigned char*>(MapScratch(3 * kPage));
  ASSERT_NE(s, nullptr);
  for (size_t i = 0; i < 3 * kPage; ++i) ASSERT_EQ(s[i], 0);
  memset(s, 1, 3 * kPage);
  UnmapScratch(s, 3 * kPage);
}

TEST(ReadPageFrames, PresentPagesHaveFramesAbsentOnesZero) {
  void* m = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* p = static_cast<unsigned char*>(m);
  p[0] = 1;  // the first page present, the second never touched
  std::vector<uint64_t> frames;
  if (!ReadPageFrames(reinterpret_cast<uintptr_t>(p), 2 * kPage, &frames)) {
    munmap(m, 2 * kPage);
    GTEST_SKIP() << "pagemap hides frame numbers here (needs CAP_SYS_ADMIN)";
  }
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_NE(frames[0], 0u);
  EXPECT_EQ(frames[1], 0u);
  // A range that starts and ends inside pages: one entry per page it touches.
  ASSERT_TRUE(ReadPageFrames(reinterpret_cast<uintptr_t>(p) + 100, kPage, &frames));
  EXPECT_EQ(frames.size(), 2u);
  munmap(m, 2 * kPage);
}

}  // namespace
}  // namespace lazypin
