// common.h: helpers shared by the lazypin test applications.
//
// The test applications are plain CUDA programs that know nothing of lazypin.
// This header gives them: a CHECK macro for runtime-API return codes, a tiny
// command-line parser (--name value / --name=value / --flag), size parsing
// ("4K", "64K", "1M", "1G"), a monotonic clock, order statistics for the
// RESULT lines, page-aligned allocation, and a cheap per-page data pattern.
// It compiles with nvcc (.cu) and with the host compiler (.cc).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdarg>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <time.h>
#include <unistd.h>

// ---------------------------------------------------------------------------
// Return-code checking.
#define CHECK(call)                                                              \
  do {                                                                           \
    cudaError_t check_err_ = (call);                                             \
    if (check_err_ != cudaSuccess) {                                             \
      std::fprintf(stderr, "%s:%d: %s -> %d (%s: %s)\n", __FILE__, __LINE__,     \
                   #call, static_cast<int>(check_err_),                          \
                   cudaGetErrorName(check_err_), cudaGetErrorString(check_err_)); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

// Checks a launch: the launch error and nothing else (no synchronisation).
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

namespace tapp {

// The case a program with several cases runs now; `out` prefixes it to the
// line it prints (stdout, flushed: outputs are compared bare vs lazypin).
inline std::string current_case;
inline void out(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void out(const char* fmt, ...) {
  std::printf("%s: ", current_case.c_str());
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::printf("\n");
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------
// Time.
inline double now_us() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

// ---------------------------------------------------------------------------
// Sizes: "4096", "4K", "64k", "1M", "1G", "1.5M" (binary multiples).
inline bool parse_size(const std::string& s, size_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) return false;
  double mul = 1;
  std::string suf(end);
  if (suf == "" || suf == "B" || suf == "b") mul = 1;
  else if (suf == "K" || suf == "k" || suf == "KiB" || suf == "KB") mul = 1024.0;
  else if (suf == "M" || suf == "m" || suf == "MiB" || suf == "MB") mul = 1024.0 * 1024;
  else if (suf == "G" || suf == "g" || suf == "GiB" || suf == "GB") mul = 1024.0 * 1024 * 1024;
  else return false;
  *out = static_cast<size_t>(v * mul);
  return true;
}

inline std::string size_name(size_t b) {
  char buf[64];
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) std::snprintf(buf, sizeof buf, "%zuG", b >> 30);
  else if (b >= (1ull << 20) && b % (1ull << 20) == 0) std::snprintf(buf, sizeof buf, "%zuM", b >> 20);
  else if (b >= 1024 && b % 1024 == 0) std::snprintf(buf, sizeof buf, "%zuK", b >> 10);
  else std::snprintf(buf, sizeof buf, "%zu", b);
  return buf;
}

// ---------------------------------------------------------------------------
// Command line: "--name value", "--name=value", boolean "--flag".
// Unknown options are an error (exit 1) so typos do not silently run defaults.
class Args {
 public:
  Args(int argc, char** argv, std::vector<std::string> known_with_value,
       std::vector<std::string> known_flags, const char* usage)
      : usage_(usage) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        std::printf("%s", usage);
        std::exit(0);
      }
      if (a.rfind("--", 0) != 0) die("unexpected argument: " + a);
      std::string name = a.substr(2), value;
      bool has_value = false;
      size_t eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      bool takes = std::find(known_with_value.begin(), known_with_value.end(), name) !=
                   known_with_value.end();
      bool flag = std::find(known_flags.begin(), known_flags.end(), name) != known_flags.end();
      if (!takes && !flag) die("unknown option --" + name);
      if (takes && !has_value) {
        if (i + 1 >= argc) die("option --" + name + " needs a value");
        value = argv[++i];
      }
      if (flag && has_value) die("option --" + name + " takes no value");
      names_.push_back(name);
      values_.push_back(flag ? std::string("1") : value);
    }
  }

  bool has(const std::string& n) const { return find(n) >= 0; }
  std::string str(const std::string& n, const std::string& def) const {
    int i = find(n);
    return i < 0 ? def : values_[i];
  }
  long long num(const std::string& n, long long def) const {
    int i = find(n);
    if (i < 0) return def;
    char* end = nullptr;
    long long v = std::strtoll(values_[i].c_str(), &end, 0);
    if (end == values_[i].c_str() || *end) die("bad number for --" + n + ": " + values_[i]);
    return v;
  }
  double real(const std::string& n, double def) const {
    int i = find(n);
    if (i < 0) return def;
    char* end = nullptr;
    double v = std::strtod(values_[i].c_str(), &end);
    if (end == values_[i].c_str() || *end) die("bad number for --" + n + ": " + values_[i]);
    return v;
  }
  size_t size(const std::string& n, size_t def) const {
    int i = find(n);
    if (i < 0) return def;
    size_t v;
    if (!parse_size(values_[i], &v)) die("bad size for --" + n + ": " + values_[i]);
    return v;
  }
  std::vector<size_t> sizes(const std::string& n, const std::string& def) const {
    std::string s = str(n, def);
    std::vector<size_t> out;
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t c = s.find(',', pos);
      if (c == std::string::npos) c = s.size();
      std::string item = s.substr(pos, c - pos);
      size_t v;
      if (!item.empty()) {
        if (!parse_size(item, &v)) die("bad size in --" + n + ": " + item);
        out.push_back(v);
      }
      pos = c + 1;
    }
    if (out.empty()) die("empty list for --" + n);
    return out;
  }

  [[noreturn]] void die(const std::string& msg) const {
    std::fprintf(stderr, "error: %s\n%s", msg.c_str(), usage_);
    std::exit(1);
  }

 private:
  int find(const std::string& n) const {
    for (int i = static_cast<int>(names_.size()) - 1; i >= 0; --i)
      if (names_[i] == n) return i;
    return -1;
  }
  const char* usage_;
  std::vector<std::string> names_, values_;
};

// ---------------------------------------------------------------------------
// Order statistics over per-iteration times (microseconds).
struct Stats {
  size_t n = 0;
  double median = 0, p90 = 0, min = 0, max = 0, mean = 0;
};

inline double percentile_sorted(const std::vector<double>& s, double p) {
  if (s.empty()) return 0;
  if (s.size() == 1) return s[0];
  double pos = p * static_cast<double>(s.size() - 1);
  size_t lo = static_cast<size_t>(pos);
  size_t hi = std::min(lo + 1, s.size() - 1);
  double f = pos - static_cast<double>(lo);
  return s[lo] * (1 - f) + s[hi] * f;
}

inline Stats stats(std::vector<double> v) {
  Stats st;
  st.n = v.size();
  if (v.empty()) return st;
  std::sort(v.begin(), v.end());
  st.median = percentile_sorted(v, 0.5);
  st.p90 = percentile_sorted(v, 0.9);
  st.min = v.front();
  st.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  st.mean = sum / static_cast<double>(v.size());
  return st;
}

// ---------------------------------------------------------------------------
// Memory.
constexpr size_t kPage = 4096;

inline void* alloc_aligned(size_t bytes, size_t align = kPage) {
  void* p = nullptr;
  if (posix_memalign(&p, align, bytes ? bytes : align) != 0 || !p) {
    std::fprintf(stderr, "posix_memalign(%zu) failed\n", bytes);
    std::exit(1);
  }
  return p;
}

// Cheap per-iteration pattern: a 64-bit tag in the first and last 8 bytes of
// every 4 KiB page (and of the buffer's tail). The rest of the buffer keeps
// whatever it held (fill it once with fill_full()).
inline uint64_t tag_for(uint64_t seed, uint64_t iter, uint64_t page) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (iter + 1) * 0xBF58476D1CE4E5B9ull ^ page;
  x ^= x >> 31;
  return x * 0x94D049BB133111EBull;
}

inline void stamp_pages(void* buf, size_t bytes, uint64_t seed, uint64_t iter) {
  unsigned char* b = static_cast<unsigned char*>(buf);
  if (bytes < 16) {
    for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<unsigned char>(tag_for(seed, iter, i));
    return;
  }
  for (size_t off = 0; off < bytes; off += kPage) {
    size_t end = std::min(off + kPage, bytes);
    uint64_t t = tag_for(seed, iter, off / kPage);
    std::memcpy(b + off, &t, 8);
    uint64_t t2 = ~t;
    std::memcpy(b + end - 8, &t2, 8);
  }
}

inline void fill_full(void* buf, size_t bytes, uint64_t seed) {
  unsigned char* b = static_cast<unsigned char*>(buf);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    std::memcpy(b + i, &x, 8);
  }
  for (; i < bytes; ++i) b[i] = static_cast<unsigned char>(i * 131 + seed);
}

// Returns the first differing offset, or -1 when equal.
inline long long first_diff(const void* a, const void* b, size_t bytes) {
  if (std::memcmp(a, b, bytes) == 0) return -1;
  const unsigned char* x = static_cast<const unsigned char*>(a);
  const unsigned char* y = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < bytes; ++i)
    if (x[i] != y[i]) return static_cast<long long>(i);
  return -1;
}

[[noreturn]] inline void data_mismatch(const char* app, const char* what, long long off) {
  std::printf("DATA MISMATCH app=%s %s offset=%lld\n", app, what, off);
  std::fflush(stdout);
  std::exit(2);
}

}  // namespace tapp
