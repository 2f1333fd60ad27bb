// path_seq.h: the fixed register/unregister call sequence shared by the four
// path_* apps (runtime symbol, dlsym'd driver symbols, driver symbols from
// cuGetProcAddress, linked driver symbols). Each app supplies the two calls;
// the sequence and the output format are identical so that a test can diff the
// four outputs (and the outputs with and without lazypin).
//
// Output, one line per call, on stdout:
//   CALL register <ptr-name> <bytes> <flags> -> <code>
//   CALL unregister <ptr-name> - - -> <code>
// then "DONE calls=<n>". ptr-name is NULL, buf, buf+4096, buf2. The path's own
// name goes to stderr ("PATH <name>") so stdout is the same for all paths.
// Expected codes on the real driver (and the simulator) are given in comments;
// the apps print what they get and exit 0 regardless.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// Checks a driver call of the app's own set-up (not the measured sequence):
// anything but success prints the call and its code, and exits 1.
#define CU_CHECK(call)                                                               \
  do {                                                                               \
    const int r_ = static_cast<int>(call);                                           \
    if (r_ != 0) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #call, r_);      \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

namespace pathseq {

template <typename Reg, typename Unreg>
int run(const char* path_name, Reg reg, Unreg unreg) {
  std::fprintf(stderr, "PATH %s\n", path_name);
  const size_t kBuf = 4 * 4096, kBuf2 = 2 * 4096;
  void* buf = nullptr;
  void* buf2 = nullptr;
  if (posix_memalign(&buf, 4096, kBuf) != 0 || posix_memalign(&buf2, 4096, kBuf2) != 0) {
    std::fprintf(stderr, "posix_memalign failed\n");
    std::exit(1);
  }
  std::memset(buf, 1, kBuf);
  std::memset(buf2, 2, kBuf2);
  char* b = static_cast<char*>(buf);
  int calls = 0;
  auto R = [&](const char* name, void* p, size_t bytes, unsigned flags) {
    int code = reg(p, bytes, flags);
    std::printf("CALL register %s %zu %u -> %d\n", name, bytes, flags, code);
    std::fflush(stdout);
    ++calls;
  };
  auto U = [&](const char* name, void* p) {
    int code = unreg(p);
    std::printf("CALL unregister %s - - -> %d\n", name, code);
    std::fflush(stdout);
    ++calls;
  };
  R("buf", buf, kBuf, 0);             // 0
  R("buf", buf, kBuf, 0);             // 712 already registered
  U("buf", buf);                      // 0
  U("buf", buf);                      // 713 not registered
  R("NULL", nullptr, 4096, 0);        // 1 invalid value
  R("buf", buf, 0, 0);                // 1 invalid value (size 0)
  U("NULL", nullptr);                 // 1 invalid value
  R("buf", buf, kBuf, 0);             // 0
  U("buf+4096", b + 4096);            // 1 (interior pointer of a registered range)
  R("buf+4096", b + 4096, 4096, 0);   // 712 overlapping
  U("buf", buf);                      // 0
  R("buf2", buf2, kBuf2, 1);          // 0 (Portable)
  U("buf2", buf2);                    // 0
  R("buf", buf, kBuf, 0);             // 0 again after unregister
  U("buf", buf);                      // 0
  std::printf("DONE calls=%d\n", calls);
  std::fflush(stdout);
  std::free(buf);
  std::free(buf2);
  return 0;
}

}  // namespace pathseq
