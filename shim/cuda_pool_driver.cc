// cuda_pool_driver: lazypin's own unregisters through the real driver (see cuda_pool_driver.h).
#include "cuda_pool_driver.h"

#include <time.h>

#include <memory>

#include "cuda.h"
#include "mem_watch.h"
#include "page_class.h"
#include "pfn.h"
#include "real.h"

namespace lazypin {

int64_t MonotonicNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

namespace {

class CudaPoolDriver final : public PoolDriver {
 public:
  CudaPoolDriver(MemWatch* watch, bool defer_shared) : watch_(watch), defer_shared_(defer_shared) {}

  PassReason Admit(uintptr_t lo, uintptr_t hi) override {
    if (!defer_shared_ && !Deferrable(ClassifyRange(lo, hi))) return PassReason::kShared;
    if (watch_ != nullptr && !watch_->Watch(lo, hi)) return PassReason::kUnwatched;
    return PassReason::kNone;
  }
  void Release(uintptr_t lo, uintptr_t hi) override {
    if (watch_ != nullptr) watch_->Unwatch(lo, hi);
  }
  void DrainChanges(absl::FunctionRef<void(uintptr_t, uintptr_t)> changed) override {
    if (watch_ != nullptr) watch_->Drain(changed);
  }

  int Unregister(uintptr_t ptr, Context ctx) override {
    auto unregister = unregister_.Get(&real::Driver, "cuMemHostUnregister");
    auto push = push_.Get(&real::Driver, "cuCtxPushCurrent_v2");
    auto pop = pop_.Get(&real::Driver, "cuCtxPopCurrent_v2");
    auto capture_mode = capture_mode_.Get(&real::Driver, "cuThreadExchangeStreamCaptureMode");
    if (unregister == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    // Not part of any stream capture the program has in progress: in the
    // default (global) mode this thread's unregister would be refused (900)
    // and invalidate another thread's capture (measured on the H200;
    // testapps/capture.cu). Allocators (PyTorch's) do the same.
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool relaxed = capture_mode != nullptr && capture_mode(&mode) == CUDA_SUCCESS;
    // The registration belongs to `ctx`; whichever thread evicts, make it current.
    const bool pushed = ctx != nullptr && push != nullptr && pop != nullptr &&
                        push(static_cast<CUcontext>(ctx)) == CUDA_SUCCESS;
    // No cuCtxSynchronize first, although waiting for the GPU here would spare
    // the other threads the unregister's stall: a synchronize invalidates a
    // capture in progress even in relaxed mode (measured, docs/design.md).
    const int result = unregister(reinterpret_cast<void*>(ptr));
    if (pushed) {
      CUcontext popped;
      pop(&popped);
    }
    if (relaxed) capture_mode(&mode);
    return result;
  }
  bool ReadFrames(uintptr_t ptr, size_t bytes, std::vector<uint64_t>* frames) override {
    return ReadPageFrames(ptr, bytes, frames);
  }
  int64_t NowNs() override { return MonotonicNs(); }

 private:
  MemWatch* const watch_;
  const bool defer_shared_;
  real::Lazy<CUresult (*)(void*)> unregister_;
  real::Lazy<CUresult (*)(CUcontext)> push_;
  real::Lazy<CUresult (*)(CUcontext*)> pop_;
  real::Lazy<CUresult (*)(CUstreamCaptureMode*)> capture_mode_;
};

}  // namespace

std::unique_ptr<PoolDriver> MakeCudaPoolDriver(MemWatch* watch, bool defer_shared) {
  return std::make_unique<CudaPoolDriver>(watch, defer_shared);
}

}  // namespace lazypin
