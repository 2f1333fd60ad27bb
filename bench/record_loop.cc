// record_loop: the per-call cost of lazypin's log mode. Registers and
// unregisters one 4 KiB page-aligned buffer N times through the runtime
// (cudaHostRegister / cudaHostUnregister: two program calls per iteration)
// and prints the mean time per call. Run it plain, with LAZYPIN_MODE=off and
// with LAZYPIN_MODE=log (LD_PRELOAD=liblazypin.so); the difference is what
// lazypin adds per call. Under `valgrind --tool=callgrind` the instruction
// counts are exact and free of the machine's noise.
//   record_loop [N]   (default 100000)
// Prints: "record_loop calls=<2N> ns_per_call=<mean>".
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char** argv) {
  const long n = argc > 1 ? atol(argv[1]) : 100000;
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, 4096) != 0) return 1;
  if (cudaFree(nullptr) != cudaSuccess) return 1;  // context creation, outside the loop
  timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; ++i) {
    if (cudaHostRegister(buf, 4096, cudaHostRegisterDefault) != cudaSuccess) return 2;
    if (cudaHostUnregister(buf) != cudaSuccess) return 2;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
  printf("record_loop calls=%ld ns_per_call=%.1f\n", 2 * n, ns / (2.0 * n));
  free(buf);
  return 0;
}
