// page_class: only private anonymous ranges are deferrable, judged by both
// methods (PROCMAP_QUERY where the kernel has it, and the maps text).
#include "page_class.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lazypin {
namespace {

const uintptr_t kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

class PageClassTest : public ::testing::TestWithParam<MapsMethod> {
 protected:
  void SetUp() override {
    if (GetParam() == MapsMethod::kProcmapQuery && !HaveProcmapQuery()) {
      GTEST_SKIP() << "no PROCMAP_QUERY in this kernel (Linux 6.11+)";
    }
  }
  PageClass Classify(const void* p, size_t bytes) {
    return ClassifyRange(Addr(p), Addr(p) + bytes, GetParam());
  }
};

TEST_P(PageClassTest, MallocAndAnonymousMmapArePrivateAnonymous) {
  std::vector<char> small(1000);
  EXPECT_EQ(Classify(small.data(), small.size()), PageClass::kPrivateAnonymous);
  void* big = malloc(64 << 20);  // glibc's mmap'd chunk
  EXPECT_EQ(Classify(big, 64 << 20), PageClass::kPrivateAnonymous);
  free(big);
  void* m = mmap(nullptr, 8 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_EQ(Classify(m, 8 * kPage), PageClass::kPrivateAnonymous);
  mprotect(static_cast<char*>(m) + kPage, kPage, PROT_READ);  // split: still anonymous
  EXPECT_EQ(Classify(m, 8 * kPage), PageClass::kPrivateAnonymous);
  munmap(m, 8 * kPage);
  int local[256];
  EXPECT_EQ(Classify(local, sizeof local), PageClass::kPrivateAnonymous);  // the stack
}

TEST_P(PageClassTest, SharedAnonymousIsShared) {
  void* m = mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_EQ(Classify(m, 4 * kPage), PageClass::kShared);
  munmap(m, 4 * kPage);
}

TEST_P(PageClassTest, MemfdSharedAndPrivate) {
  const int fd = memfd_create("page_class", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4 * kPage), 0);
  void* s = mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  void* p = mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  EXPECT_EQ(Classify(s, 4 * kPage), PageClass::kShared);
  EXPECT_EQ(Classify(p, 4 * kPage), PageClass::kFileBacked);
  static_cast<char*>(p)[0] = 1;  // a copied-on-write page: still not deferrable
  EXPECT_EQ(Classify(p, kPage), PageClass::kFileBacked);
  munmap(s, 4 * kPage);
  munmap(p, 4 * kPage);
  close(fd);
}

TEST_P(PageClassTest, DevShmFile) {
  const std::string path = "/dev/shm/lazypin_page_class_" + std::to_string(getpid());
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) GTEST_SKIP() << "no /dev/shm";
  unlink(path.c_str());
  ASSERT_EQ(ftruncate(fd, 4 * kPage), 0);
  void* s = mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT_EQ(Classify(s, 4 * kPage), PageClass::kShared);
  munmap(s, 4 * kPage);
  close(fd);
}

TEST_P(PageClassTest, RegularFilePrivate) {
  char path[] = "/tmp/page_class_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, 4 * kPage), 0);
  void* p = mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  EXPECT_EQ(Classify(p, 4 * kPage), PageClass::kFileBacked);
  munmap(p, 4 * kPage);
  close(fd);
}

TEST_P(PageClassTest, SysvShm) {
  const int id = shmget(IPC_PRIVATE, 4 * kPage, IPC_CREAT | 0600);
  if (id < 0) GTEST_SKIP() << "no SysV shm";
  void* p = shmat(id, nullptr, 0);
  shmctl(id, IPC_RMID, nullptr);
  ASSERT_NE(p, reinterpret_cast<void*>(-1));
  EXPECT_EQ(Classify(p, 4 * kPage), PageClass::kShared);
  shmdt(p);
}

TEST_P(PageClassTest, RangeSpanningAnonymousAndFile) {
  char* m = static_cast<char*>(
      mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  char path[] = "/tmp/page_class_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, kPage), 0);
  ASSERT_EQ(mmap(m + 3 * kPage, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0),
            m + 3 * kPage);
  EXPECT_EQ(Classify(m, 3 * kPage), PageClass::kPrivateAnonymous);
  EXPECT_EQ(Classify(m + 100, 3 * kPage), PageClass::kFileBacked);  // reaches the file page
  EXPECT_EQ(Classify(m + 3 * kPage, kPage), PageClass::kFileBacked);
  munmap(m, 4 * kPage);
  close(fd);
}

TEST_P(PageClassTest, HolesAreUnmapped) {
  char* m = static_cast<char*>(
      mmap(nullptr, 3 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  munmap(m + kPage, kPage);
  EXPECT_EQ(Classify(m, 3 * kPage), PageClass::kUnmapped);
  EXPECT_EQ(Classify(m + 2 * kPage, kPage), PageClass::kPrivateAnonymous);
  munmap(m, 3 * kPage);
  EXPECT_EQ(Classify(m, kPage), PageClass::kUnmapped);
}

TEST_P(PageClassTest, ForEachMappingAgreesAcrossMethods) {
  // The user address space only: the text lists [vsyscall] too, no VMA.
  const uintptr_t user_end = uintptr_t{1} << 56;
  std::vector<Mapping> a, b;
  a.reserve(4096);
  b.reserve(4096);
  ForEachMapping(0, user_end, [&](const Mapping& m) { a.push_back(m); return true; },
                 MapsMethod::kParse);
  ForEachMapping(0, user_end, [&](const Mapping& m) { b.push_back(m); return true; },
                 GetParam());
  ASSERT_GT(a.size(), 5u);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].lo, b[i].lo);
    EXPECT_EQ(a[i].hi, b[i].hi);
    EXPECT_EQ(a[i].shared, b[i].shared) << std::hex << a[i].lo;
    EXPECT_EQ(a[i].has_file, b[i].has_file) << std::hex << a[i].lo;
    EXPECT_EQ(a[i].readable, b[i].readable) << std::hex << a[i].lo;
    EXPECT_EQ(a[i].writable, b[i].writable) << std::hex << a[i].lo;
  }
}

INSTANTIATE_TEST_SUITE_P(Methods, PageClassTest,
                         ::testing::Values(MapsMethod::kProcmapQuery, MapsMethod::kParse),
                         [](const auto& info) {
                           return info.param == MapsMethod::kParse ? "Parse" : "ProcmapQuery";
                         });

}  // namespace
}  // namespace lazypin
