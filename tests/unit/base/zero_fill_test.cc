// zero_fill: ZeroNonTemporal and ZeroForProgram write zeros into exactly the
// bytes they are given, whatever the alignment of either end, and
// ZeroForProgram streams from StreamZeroFrom() on.
#include "zero_fill.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace lazypin {
namespace {

// A mapping filled with 0xa5, with `slack` bytes on each side of what is zeroed.
class Filled {
 public:
  explicit Filled(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<unsigned char*>(p);
    if (base_ != nullptr) memset(base_, 0xa5, bytes_);
  }
  ~Filled() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  unsigned char* base() const { return base_; }
  // Where [from, to) of the mapping differs from `value`: the first offset, or -1.
  int64_t FirstNot(size_t from, size_t to, unsigned char value) const {
    for (size_t i = from; i < to; ++i) {
      if (base_[i] != value) return static_cast<int64_t>(i);
    }
    return -1;
  }

 private:
  size_t bytes_;
  unsigned char* base_ = nullptr;
};

TEST(ZeroFillTest, NonTemporalZeroesExactlyItsBytesAtAnyAlignment) {
  Filled m(1 << 16);
  ASSERT_NE(m.base(), nullptr);
  for (size_t head : {0, 1, 15, 63, 64, 65}) {
    for (size_t bytes : {0, 1, 63, 64, 65, 127, 128, 4096, 4097, 12345}) {
      memset(m.base(), 0xa5, 1 << 16);
      const size_t at = 256 + head;
      ZeroNonTemporal(m.base() + at, bytes);
      EXPECT_EQ(m.FirstNot(at, at + bytes, 0), -1) << head << "+" << bytes;
      EXPECT_EQ(m.FirstNot(0, at, 0xa5), -1) << head << "+" << bytes;
      EXPECT_EQ(m.FirstNot(at + bytes, 1 << 16, 0xa5), -1) << head << "+" << bytes;
    }
  }
}

TEST(ZeroFillTest, ForProgramZeroesBlocksOnBothSidesOfTheStreamingSize) {
  const size_t from = StreamZeroFrom();
  ASSERT_GT(from, size_t{0});
#if defined(__x86_64__)
  const long cache = sysconf(_SC_LEVEL3_CACHE_SIZE);
  EXPECT_EQ(from, cache > 0 ? static_cast<size_t>(cache) / 8 * 3 : size_t{32} << 20);
  // Below it (memset) and at it, past it by an odd tail (streamed).
  for (size_t bytes : {size_t{4} << 20, from - 1, from, from + 4097}) {
    Filled m(bytes + 2 * 4096);
    ASSERT_NE(m.base(), nullptr) << bytes;
    ZeroForProgram(m.base() + 4096 + 3, bytes);
    EXPECT_EQ(m.FirstNot(4096 + 3, 4096 + 3 + bytes, 0), -1) << bytes;
    EXPECT_EQ(m.FirstNot(0, 4096 + 3, 0xa5), -1) << bytes;
    EXPECT_EQ(m.FirstNot(4096 + 3 + bytes, bytes + 2 * 4096, 0xa5), -1) << bytes;
  }
#else
  EXPECT_EQ(from, ~size_t{0});  // memset alone
#endif
}

}  // namespace
}  // namespace lazypin
