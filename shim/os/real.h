// real: finding the real functions behind the hooks, and nothing else.
// The real dlsym comes from dlvsym (our own dlsym override would recurse);
// libc's functions from RTLD_NEXT; libcuda's from its loaded handle; libcudart's
// from RTLD_NEXT or, when the runtime was loaded RTLD_LOCAL (Python
// extensions), from the loaded object found by dl_iterate_phdr.
#pragma once

#include <atomic>

namespace lazypin {
namespace real {

class ScopedResolving {
 public:
  ScopedResolving();
  ~ScopedResolving();
  ScopedResolving(const ScopedResolving&) = delete;
  ScopedResolving& operator=(const ScopedResolving&) = delete;
};

using DlsymFn = void* (*)(void*, const char*);

// glibc's dlsym (GLIBC_2.34, else GLIBC_2.2.5). Never null after first call
// unless glibc is very odd, in which case hooks degrade to passthrough.
DlsymFn Dlsym();

// The next definition of `name` after this library (libc's malloc family etc.).
void* Next(const char* name);

// `name` from the loaded libcuda.so.1 (never loads it), or null.
void* Driver(const char* name);

// `name` from a loaded libcudart (RTLD_NEXT first, then any loaded object
// whose file name starts with "libcudart.so"), or null.
void* Runtime(const char* name);

// True on a thread while it looks a real function up: the loader may free
// its own memory meanwhile, which the free hook then leaks rather than hand
// to a function it lacks.
bool Resolving();

// A lazily resolved real function, cached in a relaxed atomic: the one way
// lazypin holds a real function.
template <typename Fn>
class Lazy {
 public:
  Fn Get(void* (*resolve)(const char*), const char* name) {
    Fn fn = fn_.load(std::memory_order_relaxed);
    if (fn == nullptr) {
      ScopedResolving resolving;
      fn = reinterpret_cast<Fn>(resolve(name));
      fn_.store(fn, std::memory_order_relaxed);
    }
    return fn;
  }
  Fn Peek() const { return fn_.load(std::memory_order_relaxed); }
  // Records a real function found another way (dlsym, cuGetProcAddress), once.
  // False if the slot already holds a different one (say, a layered driver
  // and the real one beneath it): the caller must then hand out `fn` itself,
  // not the hook, which would call the other.
  bool Offer(void* fn) {
    Fn expected = nullptr;
    const Fn offered = reinterpret_cast<Fn>(fn);
    return fn_.compare_exchange_strong(expected, offered, std::memory_order_relaxed) ||
           expected == offered;
  }

 private:
  std::atomic<Fn> fn_{nullptr};
};

}  // namespace real
}  // namespace lazypin
