// prefault: large first registers faulted in by a few threads (see prefault.h).
#include "prefault.h"

#include <errno.h>
#include <sys/mman.h>

#include <atomic>
#include <thread>
#include <vector>

#include "page_class.h"
#include "pages.h"
#include "thread_state.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace lazypin {
namespace {

constexpr unsigned kReadOnly = 0x08;  // CU_MEMHOSTREGISTER_READ_ONLY
constexpr unsigned kIoMemory = 0x04;  // CU_MEMHOSTREGISTER_IOMEMORY
constexpr uintptr_t kChunkAlign = uintptr_t{2} << 20;  // whole huge pages per thread
std::atomic<bool> g_unsupported{false};

bool Populate(uintptr_t lo, uintptr_t hi) {
  if (lo >= hi) return true;
  if (madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE) == 0) return true;
  if (errno == EINVAL) g_unsupported.store(true, std::memory_order_relaxed);
  return false;
}

}  // namespace

bool ShouldPrefault(uintptr_t lo, uintptr_t hi, unsigned flags, int threads) {
  return threads > 1 && hi - lo >= kPrefaultMinBytes && (flags & (kReadOnly | kIoMemory)) == 0 &&
         !g_unsupported.load(std::memory_order_relaxed) &&
         ClassifyRange(lo, hi) == PageClass::kPrivateAnonymous;
}

int PrefaultRange(uintptr_t lo, uintptr_t hi, int threads) {
  lo = PageFloor(lo);
  hi = PageCeil(hi);
  if (threads < 1 || lo >= hi || g_unsupported.load(std::memory_order_relaxed)) return 0;
  const uintptr_t per = ((hi - lo) / threads + kChunkAlign - 1) & ~(kChunkAlign - 1);
  std::vector<LazypinThread> helpers;
  std::atomic<int> ok{0};
  uintptr_t at = lo + per;  // the first chunk is the calling thread's
  for (int i = 1; i < threads && at < hi; ++i, at += per) {
    const uintptr_t end = at + per < hi ? at + per : hi;
    helpers.push_back(StartThreadWithSignalsBlocked([at, end, &ok] {
      ScopedInsideLazypin inside;
      if (Populate(at, end)) ok.fetch_add(1, std::memory_order_relaxed);
    }));
  }
  if (Populate(lo, lo + per < hi ? lo + per : hi)) ok.fetch_add(1, std::memory_order_relaxed);
  for (LazypinThread& t : helpers) t.join();
  return ok.load();
}

}  // namespace lazypin
