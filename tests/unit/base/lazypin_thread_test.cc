// lazypin's own threads (shim/base/lazypin_thread.h): spare threads started
// ahead take the bodies later (no thread made on the caller's path), every
// signal is blocked while a body runs, unused spares end.
#include <dirent.h>
#include <signal.h>

#include <atomic>

#include "gtest/gtest.h"
#include "lazypin_thread.h"
#include "thread_state.h"

namespace lazypin {
namespace {

int Threads() {
  DIR* d = opendir("/proc/self/task");
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// The spares start asynchronously: waits until the count reaches `n`.
bool AwaitThreads(int n) {
  for (int i = 0; i < 2000 && Threads() != n; ++i) usleep(1000);
  return Threads() == n;
}

bool EverySignalBlocked() {
  sigset_t now;
  pthread_sigmask(SIG_SETMASK, nullptr, &now);
  for (int sig = 1; sig < 32; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP && !sigismember(&now, sig)) return false;
  }
  return true;
}

TEST(SpareThreads, TakeBodiesWithoutMakingThreadsAndEndWhenUnused) {
  const int before = Threads();
  PrepareSpareThreads(3);
  ASSERT_TRUE(AwaitThreads(before + 3));
  std::atomic<bool> blocked{false};
  LazypinThread a = StartLazypinThread([&] { blocked = EverySignalBlocked(); });
  EXPECT_TRUE(a.joinable());
  a.join();
  EXPECT_FALSE(a.joinable());
  EXPECT_TRUE(blocked.load()) << "a body runs with every signal blocked";
  // A spare that ran its body has ended; none was made for it.
  EXPECT_TRUE(AwaitThreads(before + 2));
  std::atomic<uint32_t> go{0};
  LazypinThread b = StartLazypinThread([&] {
    while (go.load() == 0) usleep(100);
  });
  b.detach();
  EXPECT_FALSE(b.joinable());
  EXPECT_EQ(Threads(), before + 2) << "still the spares' threads, no new one";
  go = 1;
  EXPECT_TRUE(AwaitThreads(before + 1));
  PrepareSpareThreads(2);
  usleep(20000);
  EXPECT_EQ(Threads(), before + 1) << "prepared once: a second call does nothing";
  EndUnusedSpareThreads();
  EXPECT_TRUE(AwaitThreads(before)) << "the unused spare ended";
  // No spare left: a body gets a thread of its own, also with signals blocked.
  blocked = false;
  LazypinThread c = StartLazypinThread([&] { blocked = EverySignalBlocked(); });
  c.join();
  EXPECT_TRUE(blocked.load());
  EXPECT_TRUE(AwaitThreads(before));
}

}  // namespace
}  // namespace lazypin
