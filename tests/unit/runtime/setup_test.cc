// runtime/ against hooks of the test's own (HookSide): what set-up asks of
// the hooks in each mode, what it publishes, and a fork's child. Set-up is
// once per process, so each case runs in a child of its own (a death test's).
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "gtest/gtest.h"
#include "shim.h"
#include "state.h"

namespace lazypin {
namespace {

std::atomic<int> g_self_tests{0}, g_reuse_checks{0}, g_real_frees{0};
std::atomic<int64_t> g_gauge{0};

bool SelfTestPasses(std::string*) {
  ++g_self_tests;
  return true;
}
bool SelfTestFails(std::string* why) {
  ++g_self_tests;
  *why = "the test's own refusal";
  return false;
}
bool ReuseRefused(std::string* why) {
  ++g_reuse_checks;
  *why = "the test's allocator";
  return false;
}
void CountingFree(void* p) {
  ++g_real_frees;
  free(p);
}

constexpr HookSide kPassing{&SelfTestPasses, &ReuseRefused, &CountingFree, &g_gauge};
constexpr HookSide kFailing{&SelfTestFails, &ReuseRefused, &CountingFree, &g_gauge};

// In the death test's child: sets lazypin up with LAZYPIN_MODE=`mode` (the
// hooks' watch alone: no userfaultfd needed), then exits with `check`'s
// answer (0: as expected).
[[noreturn]] void SetUpAndExit(const char* mode, const HookSide& hooks,
                               int (*check)(const ShimState* state)) {
  setenv("LAZYPIN_MODE", mode, 1);
  setenv("LAZYPIN_WATCH", "hooks", 1);
  setenv("LAZYPIN_REUSE_FREED", "1", 1);
  setenv("LAZYPIN_LOG", "/dev/null", 1);
  _exit(check(ActiveState(hooks)));
}

TEST(RuntimeSetUpTest, OffPublishesPassThroughAndAsksTheHooksNothing) {
  EXPECT_EXIT(SetUpAndExit("off", kPassing,
                           [](const ShimState* s) {
                             return s != nullptr && s->effective == Mode::kOff &&
                                            s->dispatch == nullptr && s->guard == nullptr &&
                                            g_self_tests == 0 && g_reuse_checks == 0
                                        ? 0
                                        : 1;
                           }),
              testing::ExitedWithCode(0), "");
}

TEST(RuntimeSetUpTest, LogModeRecordsWithoutThePoolAndAsksTheHooksNothing) {
  EXPECT_EXIT(SetUpAndExit("log", kPassing,
                           [](const ShimState* s) {
                             return s != nullptr && s->effective == Mode::kLog &&
                                            s->dispatch != nullptr && s->dispatch->pool() == nullptr &&
                                            s->guard == nullptr && g_self_tests == 0 &&
                                            g_reuse_checks == 0
                                        ? 0
                                        : 1;
                           }),
              testing::ExitedWithCode(0), "");
}

TEST(RuntimeSetUpTest, DeferAsksTheHooksSelfTestAndTheAllocatorOnce) {
  EXPECT_EXIT(SetUpAndExit("defer", kPassing,
                           [](const ShimState* s) {
                             return s != nullptr && s->effective == Mode::kDefer &&
                                            s->dispatch != nullptr && s->dispatch->pool() != nullptr &&
                                            !s->dispatch->pool()->ReuseEnabled() &&
                                            s->guard != nullptr && g_self_tests == 1 &&
                                            g_reuse_checks == 1 && g_real_frees == 0
                                        ? 0
                                        : 1;
                           }),
              testing::ExitedWithCode(0), "");
}

TEST(RuntimeSetUpTest, AFailedSelfTestOfTheHooksTurnsDeferIntoLogAndSaysWhy) {
  EXPECT_EXIT(SetUpAndExit("defer", kFailing,
                           [](const ShimState* s) {
                             return s != nullptr && s->requested == Mode::kDefer &&
                                            s->effective == Mode::kLog && s->guard == nullptr &&
                                            std::string(s->why).find("the test's own refusal") !=
                                                std::string::npos
                                        ? 0
                                        : 1;
                           }),
              testing::ExitedWithCode(0), "");
}

TEST(RuntimeSetUpTest, AForkChildPassesThroughAndZeroesTheHooksGauge) {
  EXPECT_EXIT(SetUpAndExit("defer", kPassing,
                           [](const ShimState* s) {
                             if (s == nullptr || s->effective != Mode::kDefer) return 1;
                             g_gauge.store(5);
                             g_shim->InForkChild(/*raw_copy=*/true);
                             const ShimState* child = PublishedState();
                             return child->effective == Mode::kOff && child->dispatch == nullptr &&
                                            g_gauge.load() == 0
                                        ? 0
                                        : 2;
                           }),
              testing::ExitedWithCode(0), "");
}

TEST(RuntimeSetUpTest, SetUpWithCudaStaysOffWhenLazypinIsOff) {
  EXPECT_EXIT(
      {
        setenv("LAZYPIN_MODE", "off", 1);
        SetUpWithCuda(kPassing);
        _exit(PublishedState() == nullptr ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
}

TEST(RuntimeSetUpTest, SetUpWithCudaSetsUpOnce) {
  EXPECT_EXIT(
      {
        setenv("LAZYPIN_MODE", "log", 1);
        setenv("LAZYPIN_LOG", "/dev/null", 1);
        SetUpWithCuda(kPassing);
        const ShimState* first = PublishedState();
        SetUpWithCuda(kFailing);
        _exit(first != nullptr && first->effective == Mode::kLog && PublishedState() == first ? 0
                                                                                               : 1);
      },
      testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace lazypin
