// host_alloc_view: everything a program can see of a pinned host block, one
// line per answer, pointers written relative to the block so that two runs
// (bare, under lazypin) or two kinds of block can be compared with diff.
//
//   host_alloc_view [--kind alloc|register] [--size 64M] [--flags all|N,...]
//     alloc:    cuMemHostAlloc(size, flags) (PORTABLE 1, DEVICEMAP 2,
//               WRITECOMBINED 4) and cudaHostAlloc of the same flags;
//     register: mmap + cuMemHostRegister(size, PORTABLE/DEVICEMAP of flags),
//               the block a program would make itself.
//   For each block: its alignment, whether it reads zeros, the flag queries,
//   every cuPointerGetAttribute attribute at its start, one page in and its
//   last byte, cudaPointerGetAttributes, cudaHostGetDevicePointer, a copy to
//   and from the device, a device write through the mapped pointer, the
//   attributes and a copy from a second context, a register of a page inside
//   it, a fork's child reading and writing it, and (alloc) cuMemHostUnregister
//   of it, an interior free and the free.
#include <cuda.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"

namespace {

uintptr_t g_lo = 0, g_hi = 0;  // the block being looked at
CUcontext g_ctx = nullptr, g_ctx2 = nullptr;

void out(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::printf("\n");
}

// A value as the block sees it: an offset into it, the contexts, or the number.
std::string Rel(unsigned long long v) {
  char b[64];
  if (v >= g_lo && v < g_hi) {
    std::snprintf(b, sizeof b, "block+%llu", v - g_lo);
  } else if (v != 0 && v == reinterpret_cast<uintptr_t>(g_ctx)) {
    std::snprintf(b, sizeof b, "ctx");
  } else if (v != 0 && v == reinterpret_cast<uintptr_t>(g_ctx2)) {
    std::snprintf(b, sizeof b, "ctx2");
  } else {
    std::snprintf(b, sizeof b, "%llu", v);
  }
  return b;
}

struct Attr {
  CUpointer_attribute a;
  const char* name;
  bool id;  // an identifier: only whether it is set is comparable
};
const Attr kAttrs[] = {
    {CU_POINTER_ATTRIBUTE_CONTEXT, "CONTEXT", false},
    {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, "MEMORY_TYPE", false},
    {CU_POINTER_ATTRIBUTE_DEVICE_POINTER, "DEVICE_POINTER", false},
    {CU_POINTER_ATTRIBUTE_HOST_POINTER, "HOST_POINTER", false},
    {CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, "SYNC_MEMOPS", false},
    {CU_POINTER_ATTRIBUTE_BUFFER_ID, "BUFFER_ID", true},
    {CU_POINTER_ATTRIBUTE_IS_MANAGED, "IS_MANAGED", false},
    {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, "DEVICE_ORDINAL", false},
    {CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, "IS_LEGACY_CUDA_IPC_CAPABLE", false},
    {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, "RANGE_START_ADDR", false},
    {CU_POINTER_ATTRIBUTE_RANGE_SIZE, "RANGE_SIZE", false},
    {CU_POINTER_ATTRIBUTE_MAPPED, "MAPPED", false},
    {CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, "ALLOWED_HANDLE_TYPES", false},
    {CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, "IS_GPU_DIRECT_RDMA_CAPABLE", false},
    {CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, "ACCESS_FLAGS", false},
    {CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, "MEMPOOL_HANDLE", false},
    {CU_POINTER_ATTRIBUTE_MAPPING_SIZE, "MAPPING_SIZE", false},
    {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, "MAPPING_BASE_ADDR", false},
    {CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, "MEMORY_BLOCK_ID", true},
};

void Attributes(const char* where, const void* p) {
  std::string line;
  for (const Attr& at : kAttrs) {
    unsigned long long v[8] = {};
    const int rc = cuPointerGetAttribute(v, at.a, reinterpret_cast<CUdeviceptr>(p));
    char b[128];
    if (rc != 0) {
      std::snprintf(b, sizeof b, " %s=rc%d", at.name, rc);
    } else if (at.id) {
      std::snprintf(b, sizeof b, " %s=%s", at.name, v[0] != 0 ? "set" : "0");
    } else {
      std::snprintf(b, sizeof b, " %s=%s", at.name, Rel(v[0]).c_str());
    }
    line += b;
  }
  out("  attributes at %s:%s", where, line.c_str());
}

void RuntimeViews(const char* where, const void* p) {
  cudaPointerAttributes a{};
  const int rc = cudaPointerGetAttributes(&a, p);
  void* d = nullptr;
  const int rd = cudaHostGetDevicePointer(&d, const_cast<void*>(p), 0);
  unsigned int f = 0;
  const int rf = cudaHostGetFlags(&f, const_cast<void*>(p));
  cudaGetLastError();
  out("  runtime at %s: cudaPointerGetAttributes=%d type=%d device=%d devicePointer=%s hostPointer=%s "
      "cudaHostGetDevicePointer=%d %s cudaHostGetFlags=%d flags=%u", where, rc, int(a.type), a.device,
      Rel(reinterpret_cast<uintptr_t>(a.devicePointer)).c_str(),
      Rel(reinterpret_cast<uintptr_t>(a.hostPointer)).c_str(), rd,
      Rel(reinterpret_cast<uintptr_t>(d)).c_str(), rf, rf == 0 ? f : 0);
  unsigned int df = 0;
  const int rdf = cuMemHostGetFlags(&df, const_cast<void*>(p));
  CUdeviceptr dp = 0;
  const int rdp = cuMemHostGetDevicePointer(&dp, const_cast<void*>(p), 0);
  out("  driver at %s: cuMemHostGetFlags=%d flags=%u cuMemHostGetDevicePointer=%d %s", where, rdf,
      rdf == 0 ? df : 0, rdp, Rel(dp).c_str());
}

void Look(const char* kind, unsigned flags, size_t size, char* p) {
  g_lo = reinterpret_cast<uintptr_t>(p);
  g_hi = g_lo + size;
  int align = 0;
  while (align < 30 && (g_lo & ((uintptr_t{2} << align) - 1)) == 0) ++align;
  size_t nonzero = 0;
  for (size_t i = 0; i < size; i += 4096) nonzero += p[i] != 0 || p[size - 1 - (i % size)] != 0;
  out("%s flags=%u size=%zu: aligned to 2^%d, %s", kind, flags, size, align + 1,
      nonzero ? "NOT ZERO" : "zeros");
  const char* wheres[] = {"start", "page 1", "last byte"};
  const size_t offs[] = {0, 4096, size - 1};
  for (int i = 0; i < 3; ++i) {
    Attributes(wheres[i], p + offs[i]);
    RuntimeViews(wheres[i], p + offs[i]);
  }
  // Copies both ways, and the device writing through the mapped pointer.
  CUdeviceptr dev = 0;
  if (cuMemAlloc(&dev, 1 << 20) != 0) out("  cuMemAlloc failed");
  std::memset(p, 0x3c, 1 << 20);
  const int h2d = cuMemcpyHtoD(dev, p, 1 << 20);
  std::memset(p, 0, 1 << 20);
  const int d2h = cuMemcpyDtoH(p, dev, 1 << 20);
  out("  copies: HtoD=%d DtoH=%d back=%s", h2d, d2h, p[0] == 0x3c && p[(1 << 20) - 1] == 0x3c ? "same" : "DIFFERENT");
  CUdeviceptr mapped = 0;
  const int rm = cuMemHostGetDevicePointer(&mapped, p, 0);
  int memset_rc = -1;
  if (rm == 0) {
    memset_rc = cuMemsetD8(mapped + 8192, 0x5e, 4096);
    cuCtxSynchronize();
  }
  out("  device write through the mapped pointer: %d host sees %d", memset_rc, memset_rc == 0 ? p[8192] : -1);
  cuMemFree(dev);
  // From a second context of the same device.
  CUdevice device = 0;
  cuCtxGetDevice(&device);
  if (g_ctx2 == nullptr) cuCtxCreate(&g_ctx2, nullptr, 0, device);
  else cuCtxPushCurrent(g_ctx2);
  Attributes("start, from a second context", p);
  CUdeviceptr dev2 = 0;
  cuMemAlloc(&dev2, 4096);
  out("  second context: HtoD=%d", cuMemcpyHtoD(dev2, p, 4096));
  cuMemFree(dev2);
  CUcontext popped;
  cuCtxPopCurrent(&popped);
  // A register of a page inside it.
  const int rr = cuMemHostRegister(p + 4096 * 4, 4096, 0);
  out("  register of a page inside: %d", rr);
  if (rr == 0) cuMemHostUnregister(p + 4096 * 4);
  cudaGetLastError();
  // A fork's child: what it reads, and whether its write reaches the parent.
  p[100] = 0x11;
  std::fflush(stdout);
  const pid_t child = fork();
  if (child == 0) {
    const int seen = static_cast<unsigned char>(p[100]);
    p[101] = 0x22;
    std::printf("  fork: child reads %d, wrote\n", seen);
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  out("  fork: child %s; parent sees the child's write: %s",
      WIFEXITED(status) ? "exited" : WIFSIGNALED(status) ? (WTERMSIG(status) == SIGSEGV ? "SIGSEGV" : "signalled") : "?",
      p[101] == 0x22 ? "yes" : "no");
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"kind", "size", "flags"}, {},
                  "usage: host_alloc_view [--kind alloc|register] [--size 64M] [--flags all|N,...]\n");
  const std::string kind = args.str("kind", "alloc");
  const size_t size = args.size("size", size_t{64} << 20);
  std::vector<unsigned> flag_sets;
  const std::string fl = args.str("flags", "all");
  if (fl == "all") {
    flag_sets = {0, 1, 2, 3, 4, 7};
  } else {
    for (size_t at = 0; at < fl.size();) {
      size_t end = fl.find(',', at);
      if (end == std::string::npos) end = fl.size();
      flag_sets.push_back(static_cast<unsigned>(std::stoul(fl.substr(at, end - at))));
      at = end + 1;
    }
  }
  CHECK(cudaFree(nullptr));
  cuCtxGetCurrent(&g_ctx);
  for (unsigned flags : flag_sets) {
    for (int runtime = 0; runtime < 2; ++runtime) {
      char* p = nullptr;
      int rc;
      if (kind == "register") {
        if (runtime) continue;
        void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        p = static_cast<char*>(m);
        rc = cuMemHostRegister(p, size, flags & 3);
      } else if (runtime) {
        rc = cudaHostAlloc(reinterpret_cast<void**>(&p), size, flags);
      } else {
        rc = cuMemHostAlloc(reinterpret_cast<void**>(&p), size, flags);
      }
      const char* what = kind == "register" ? "cuMemHostRegister" : runtime ? "cudaHostAlloc" : "cuMemHostAlloc";
      if (rc != 0) {
        out("%s flags=%u size=%zu: %d", what, flags, size, rc);
        continue;
      }
      Look(what, flags, size, p);
      if (kind == "register") {
        out("  unregister: %d", cuMemHostUnregister(p));
        munmap(p, size);
        continue;
      }
      out("  cuMemHostUnregister: %d, cudaHostUnregister: %d, cudaHostUnregister inside: %d",
          cuMemHostUnregister(p), int(cudaHostUnregister(p)), int(cudaHostUnregister(p + 4096)));
      cudaGetLastError();
      out("  interior free: %d", runtime ? int(cudaFreeHost(p + 4096)) : cuMemFreeHost(p + 4096));
      cudaGetLastError();
      out("  free: %d", runtime ? int(cudaFreeHost(p)) : cuMemFreeHost(p));
      Attributes("start, after the free", p);
    }
  }
  return 0;
}
