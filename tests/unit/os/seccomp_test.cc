// Whether a seccomp filter may be in force (shim/os/seccomp.h): seen on the
// thread that has one, then taken as in force everywhere; noticed once.
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "gtest/gtest.h"
#include "seccomp.h"

namespace lazypin {
namespace {

// A filter that allows every call: what matters is that one is installed.
bool InstallAllowAll() {
  sock_filter allow[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
  sock_fprog prog{1, allow};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

TEST(Seccomp, AFilterOnOneThreadIsInForceForAllFromThenOn) {
  if (SeccompFiltered()) GTEST_SKIP() << "this test runs under a filter already";
  EXPECT_FALSE(SeccompFilterSeen());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // In the child: a thread installs a filter (filters are per thread).
    bool installed = false, seen_there = false;
    std::thread t([&] {
      installed = InstallAllowAll();
      seen_there = SeccompFiltered();
    });
    t.join();
    if (!installed) _exit(10);
    if (!seen_there) _exit(1);
    if (!SeccompFilterSeen()) _exit(2);   // another thread: seen already
    if (!SeccompFiltered()) _exit(3);     // and it stays in force
    if (!TakeSeccompNotice()) _exit(4);   // the first caller is told
    if (TakeSeccompNotice()) _exit(5);    // nobody after it
    if (SeccompStatusText().find("Seccomp") == std::string::npos) _exit(6);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 10) GTEST_SKIP() << "this kernel refused a seccomp filter";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the check that failed (see the child's exit codes)";
  EXPECT_FALSE(SeccompFiltered()) << "the child's filter is not the parent's";
}

}  // namespace
}  // namespace lazypin
