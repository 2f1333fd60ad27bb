// CallSites: stacks interned once each, written before their first use,
// lazypin's own frames left out, bounded.
#include "callsite.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazypin {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// What a CallSites emits, as the log would write it: a `stack` record's line
// made from its id afterwards (emit runs with the table locked).
struct Lines {
  explicit Lines(CallSites& s) : sites(s) {}
  operator CallSites::Emit() { return {on_objects, on_stack}; }
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    for (const auto& [text, id] : emitted) out.push_back(id != 0 ? sites.StackLine(id) : text);
    return out;
  }
  CallSites& sites;
  std::vector<std::pair<std::string, int>> emitted;  // a line, or a stack's id
  std::function<void(std::string&&)> on_objects = [this](std::string&& l) { emitted.push_back({l, 0}); };
  std::function<void(int)> on_stack = [this](int id) { emitted.push_back({"", id}); };
};

__attribute__((noinline)) int CaptureHere(CallSites& sites, Lines& out) {
  const int id = sites.Capture(out);
  asm volatile("" ::: "memory");  // not a tail call: this frame stays on the stack
  return id;
}
__attribute__((noinline)) int SiteA(CallSites& sites, Lines& out) {
  const int id = CaptureHere(sites, out);
  asm volatile("" ::: "memory");
  return id;
}
__attribute__((noinline)) int SiteB(CallSites& sites, Lines& out) {
  const int id = CaptureHere(sites, out);
  asm volatile("" ::: "memory");
  return id;
}

TEST(CallSitesTest, OneIdPerStackWrittenOnceBeforeItsFirstUse) {
  CallSites sites(nullptr);
  Lines out(sites);
  int a[3], b;
  for (int& id : a) id = SiteA(sites, out);  // the same return addresses each time
  b = SiteB(sites, out);
  EXPECT_EQ(a[0], 1);
  EXPECT_EQ(a[1], a[0]);
  EXPECT_EQ(a[2], a[0]);
  EXPECT_EQ(b, 2);
  // objects (all of them: none known yet), stack 1, stack 2: nothing for the repeats.
  ASSERT_EQ(out.lines().size(), 3u);
  EXPECT_THAT(out.lines()[0], StartsWith(R"({"type":"objects","list":[{"path":")"));
  EXPECT_THAT(out.lines()[0], HasSubstr("callsite_test"));  // the executable, by its path
  EXPECT_THAT(out.lines()[1], StartsWith(R"({"type":"stack","id":1,"frames":["0x)"));
  EXPECT_THAT(out.lines()[2], StartsWith(R"({"type":"stack","id":2,"frames":["0x)"));
}

__attribute__((noinline)) int OnceHere(CallSites& sites, Lines& out, uint64_t key) {
  const int id = sites.CaptureOnce(key, out);
  asm volatile("" ::: "memory");
  return id;
}
__attribute__((noinline)) int OnceThere(CallSites& sites, Lines& out, uint64_t key) {
  const int id = sites.CaptureOnce(key, out);
  asm volatile("" ::: "memory");
  return id;
}

TEST(CallSitesTest, OneCaptureForEachCallShape) {
  CallSites sites(nullptr);
  Lines out(sites);
  const int a = OnceHere(sites, out, 42);
  EXPECT_EQ(OnceThere(sites, out, 42), a);  // same shape: not unwound again, so the first stack
  const int b = OnceThere(sites, out, 43);
  EXPECT_NE(b, a);
  EXPECT_NE(OnceHere(sites, out, 0), OnceThere(sites, out, 0));  // 0: every call unwound
}

TEST(CallSitesTest, TwoKeysOfOneSlotAlternatingAreEachUnwoundOnce) {
  // Two keys that land in the same slot (as a wrapper's two callers may).
  const auto slot = [](uint64_t k) { return (k * 0x9e3779b97f4a7c15u) >> 52; };
  uint64_t other = 2;
  while (slot(other) != slot(1)) ++other;
  CallSites sites(nullptr);
  Lines out(sites);
  const int a = OnceHere(sites, out, 1);
  const int b = OnceThere(sites, out, other);
  ASSERT_NE(a, b);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(OnceThere(sites, out, 1), a);
    EXPECT_EQ(OnceHere(sites, out, other), b);
  }
  EXPECT_EQ(sites.unwound(), 2u);
  EXPECT_EQ(sites.unique(), 2u);
}

TEST(CallSitesTest, OfThreeKeysOfOneSlotTheTwoUnwoundLastAreKept) {
  const auto pair = [](uint64_t k) { return ((k * 0x9e3779b97f4a7c15u) >> 52) & ~uint64_t{1}; };
  uint64_t keys[3] = {1, 0, 0};
  for (uint64_t k = 2, found = 1; found < 3; ++k) {
    if (pair(k) == pair(1)) keys[found++] = k;
  }
  CallSites sites(nullptr);
  Lines out(sites);
  for (uint64_t k : keys) OnceHere(sites, out, k);  // the first key is pushed out
  EXPECT_EQ(sites.unwound(), 3u);
  OnceHere(sites, out, keys[1]);
  OnceHere(sites, out, keys[2]);
  EXPECT_EQ(sites.unwound(), 3u);
  OnceHere(sites, out, keys[0]);
  EXPECT_EQ(sites.unwound(), 4u);
}

TEST(CallSitesTest, FramesAreReturnAddressesInnermostFirst) {
  uintptr_t frames[CallSites::kMaxFrames];
  const size_t n = CaptureFrames(frames, CallSites::kMaxFrames, 0, 0);
  ASSERT_GE(n, 2u);
  Dl_info info;
  // The innermost frame is inside CaptureFrames' caller chain: this test's executable.
  ASSERT_NE(dladdr(reinterpret_cast<void*>(frames[1]), &info), 0);
  EXPECT_THAT(std::string(info.dli_fname), HasSubstr("callsite_test"));
}

__attribute__((noinline)) size_t BothWalks(uintptr_t* ours, void** glibc, int* glibc_count) {
  const size_t n = CaptureFrames(ours, CallSites::kMaxFrames, 0, 0);
  *glibc_count = backtrace(glibc, CallSites::kMaxFrames);
  asm volatile("" ::: "memory");
  return n;
}

TEST(CallSitesTest, TheWalkFindsTheFramesGlibcFinds) {
  uintptr_t ours[CallSites::kMaxFrames];
  void* glibc[CallSites::kMaxFrames];
  int glibc_count = 0;
  const size_t n = BothWalks(ours, glibc, &glibc_count);
  // From the caller of BothWalks on, both list the same return addresses.
  ASSERT_GE(n, 3u);
  ASSERT_GE(glibc_count, 3);
  std::vector<uintptr_t> a(ours + 1, ours + n);
  std::vector<uintptr_t> b;
  for (int i = 1; i < glibc_count; ++i) b.push_back(reinterpret_cast<uintptr_t>(glibc[i]));
  const size_t common = std::min(a.size(), b.size()) - 1;  // the last may be cut by the capacity
  EXPECT_EQ(std::vector<uintptr_t>(a.begin(), a.begin() + common),
            std::vector<uintptr_t>(b.begin(), b.begin() + common));
}

#if defined(__x86_64__)
// A fiber whose outermost return address is bogus: the walk ends there,
// without reading at it nor past the stack's mapping (a guard page above).
ucontext_t g_main, g_fiber;
size_t g_fiber_frames = 0;
void FiberCapture() {
  uintptr_t frames[CallSites::kMaxFrames];
  g_fiber_frames = CaptureFrames(frames, CallSites::kMaxFrames, 0, 0);
  swapcontext(&g_fiber, &g_main);
}

// Runs FiberCapture on a fresh 64 KiB stack below a guard page, its return
// address `bogus` (at the stack's last word when `at_top`); returns the frames.
char* g_map = nullptr;
constexpr size_t kFiberBytes = 64 << 10;
__attribute__((noinline)) size_t WalkOnFiber(uintptr_t bogus, bool at_top) {
  g_map = static_cast<char*>(mmap(nullptr, kFiberBytes + 4096, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (g_map == MAP_FAILED || mprotect(g_map + kFiberBytes, 4096, PROT_NONE) != 0) return 0;
  getcontext(&g_fiber);
  g_fiber.uc_stack.ss_sp = g_map;
  g_fiber.uc_stack.ss_size = kFiberBytes;
  g_fiber.uc_link = nullptr;
  makecontext(&g_fiber, FiberCapture, 0);
  auto* ret = reinterpret_cast<uintptr_t*>(g_fiber.uc_mcontext.gregs[REG_RSP]);
  if (at_top) {  // the bogus frame's stack pointer is the guard page
    ret = reinterpret_cast<uintptr_t*>(g_map + kFiberBytes) - 1;
    g_fiber.uc_mcontext.gregs[REG_RSP] = reinterpret_cast<greg_t>(ret);
  }
  *ret = bogus;
  g_fiber_frames = 0;
  swapcontext(&g_main, &g_fiber);
  munmap(g_map, kFiberBytes + 4096);
  return g_fiber_frames;
}

TEST(CallSitesTest, AFiberWithABogusReturnAddressEndsTheWalk) {
  const uintptr_t bogus[] = {0x1234, reinterpret_cast<uintptr_t>(&printf) + 9, ~uintptr_t{0} - 7};
  for (uintptr_t address : bogus) {
    for (bool at_top : {false, true}) {
      const size_t frames = WalkOnFiber(address, at_top);
      EXPECT_GE(frames, 1u) << std::hex << address << " " << at_top;
      EXPECT_LE(frames, 4u) << "the fiber's own frames, then the bogus one at most";
    }
  }
}
#endif

TEST(CallSitesTest, LeavesOutTheFramesOfItsOwnObject) {
  // This executable plays lazypin: none of its frames may appear.
  const auto self = CallSites::ObjectRange(reinterpret_cast<const void*>(&CaptureHere));
  ASSERT_NE(self.second, 0u);
  uintptr_t frames[CallSites::kMaxFrames];
  const size_t n = CaptureFrames(frames, CallSites::kMaxFrames, self.first, self.second);
  ASSERT_GE(n, 1u);  // libc's start-up frames remain
  for (size_t i = 0; i < n; ++i) {
    EXPECT_FALSE(frames[i] >= self.first && frames[i] < self.second) << i;
  }
  CallSites sites(reinterpret_cast<const void*>(&CaptureHere));
  Lines out(sites);
  EXPECT_GE(SiteA(sites, out), 1);
  ASSERT_FALSE(out.lines().empty());
  EXPECT_THAT(out.lines().back(), ::testing::Not(HasSubstr("callsite_test")));
}

TEST(CallSitesTest, AtMostMaxFramesEach) {
  std::vector<uintptr_t> frames(100);
  for (size_t i = 0; i < frames.size(); ++i) frames[i] = 0x1000 + i;
  CallSites sites(nullptr);
  Lines out(sites);
  ASSERT_EQ(sites.Intern(frames.data(), frames.size(), "", out), 1);
  const std::string stack = out.lines().back();
  size_t commas = 0;
  for (char c : stack) commas += c == ',';
  EXPECT_EQ(commas, 2 + CallSites::kMaxFrames - 1);  // two before "frames", then one between frames
}

TEST(CallSitesTest, APythonLineIsPartOfTheStack) {
  CallSites sites(nullptr);
  Lines out(sites);
  const uintptr_t frames[2] = {0x1000, 0x2000};
  const int a = sites.Intern(frames, 2, "train.py:12 in step", out);
  const int b = sites.Intern(frames, 2, "eval.py:3 in run", out);
  EXPECT_NE(a, b);
  EXPECT_EQ(sites.Intern(frames, 2, "train.py:12 in step", out), a);
  EXPECT_EQ(sites.Intern(frames, 2, "", out), 3);
  std::vector<std::string> stacks;
  for (const std::string& line : out.lines()) {
    if (line.find(R"("type":"stack")") != std::string::npos) stacks.push_back(line);
  }
  ASSERT_EQ(stacks.size(), 3u);
  EXPECT_THAT(stacks[0], HasSubstr(R"(],"python":"train.py:12 in step"})"));
  EXPECT_THAT(stacks[2], ::testing::Not(HasSubstr("python")));
}

TEST(CallSitesTest, AFullTableGivesNoIdAndKeepsTheOldOnes) {
  CallSites sites(nullptr);
  Lines out(sites);
  int last = 0;
  uintptr_t frame = 0x1000;
  for (size_t i = 0; i < CallSites::kSlots; ++i) {
    frame += 16;
    const int id = sites.Intern(&frame, 1, "", out);
    if (id == 0) break;
    last = id;
  }
  EXPECT_GE(static_cast<size_t>(last), CallSites::kSlots / 2);
  EXPECT_LT(static_cast<size_t>(last), CallSites::kSlots);
  frame += 16;
  EXPECT_EQ(sites.Intern(&frame, 1, "", out), 0);
  uintptr_t first = 0x1010;
  EXPECT_EQ(sites.Intern(&first, 1, "", out), 1);  // known stacks keep their ids
  EXPECT_EQ(sites.Intern(&first, 0, "", out), 0);  // no frames: no stack
}

}  // namespace
}  // namespace lazypin
