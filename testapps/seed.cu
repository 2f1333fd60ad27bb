// seed.cu: the forum post's original benchmark ("CUDA 4.0 - cudaHostUnregister
// runs slowly"), same steps, sizes and output format as the post.
//
// Scenario: two page-aligned posix_memalign buffers of 999424 ints (3.8 MiB),
// cudaMalloc of two device buffers (first CUDA call: context creation), a
// pageable copy, cudaHostRegister of the second buffer, a page-locked copy,
// cudaHostUnregister. Times use CLOCK_REALTIME, as in the post. The return code
// of each call is printed with printf("%20d\n", code), as in the post (the
// unregister's code is not printed, as in the post).
//
// CLI:  seed [--repeat N] [--quick]
//   --repeat N  repeat the register / page-locked copy / unregister part N times,
//               printing the same three timing lines each time (default 1: the
//               output is line for line the post's). From the 2nd repetition on
//               lazypin's defer mode turns the register into a pool hit.
//   --quick     accepted for uniformity with the other apps; the program is
//               already short (it changes nothing).
// Prints: the post's lines:
//                      0
//                      0
//   Initialization:       81027005 ns
//   ...
//   Host unregister:       2139736 ns
#include <stdio.h>
#include <time.h>
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>

static struct timespec tp;
static clockid_t clk = CLOCK_REALTIME;

static void tu_timer_start(void)
{
  int res = clock_gettime(clk, &tp);
  assert(!res);
  (void)res;
}

static long long tu_timer_stop(void)
{
  struct timespec tp_new;
  long long elapsed;
  int res = clock_gettime(clk, &tp_new);

  assert(!res);
  (void)res;

  elapsed = 1000000000LL * (tp_new.tv_sec - tp.tv_sec) + tp_new.tv_nsec - tp.tv_nsec;
  tp = tp_new;

  return elapsed;
}

int main(int argc, char** argv) {
  int repeat = 1;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
      repeat = atoi(argv[++i]);
    } else if (strncmp(argv[i], "--repeat=", 9) == 0) {
      repeat = atoi(argv[i] + 9);
    } else if (strcmp(argv[i], "--quick") == 0) {
      /* nothing: the program is already short */
    } else {
      fprintf(stderr, "usage: %s [--repeat N] [--quick]\n", argv[0]);
      return 1;
    }
  }
  if (repeat < 1) {
    fprintf(stderr, "--repeat must be >= 1\n");
    return 1;
  }

  const int length = 999424;
  const int pagesize = 4096;

  // Allocating page-aligned host data and filling it with zeroes.
  int *paged, *locked;
  if (posix_memalign((void**) &paged, pagesize, length * sizeof(int)) != 0 ||
      posix_memalign((void**) &locked, pagesize, length * sizeof(int)) != 0) {
    fprintf(stderr, "posix_memalign failed\n");
    return 1;
  }
  memset(paged, 0, length * sizeof(int));
  memset(locked, 0, length * sizeof(int));

  // Allocating device data.
  int *devPaged, *devLocked;
  tu_timer_start();
  printf("%20d\n", cudaMalloc(&devPaged, length * sizeof(int)));
  printf("%20d\n", cudaMalloc(&devLocked, length * sizeof(int)));
  printf("Initialization:   %12lld ns\n", tu_timer_stop());

  // Measure copy time with pageable data.
  tu_timer_start();
  printf("%20d\n", cudaMemcpy(devPaged, paged, length * sizeof(int), cudaMemcpyHostToDevice));
  printf("Copy pageable:    %12lld ns\n", tu_timer_stop());

  for (int r = 0; r < repeat; ++r) {
    // Measure time to page-lock host data.
    tu_timer_start();
    printf("%20d\n", cudaHostRegister(locked, length * sizeof(int), 0));
    printf("Host register:    %12lld ns\n", tu_timer_stop());

    // Measure copy time with page-locked data.
    tu_timer_start();
    printf("%20d\n", cudaMemcpy(devLocked, locked, length * sizeof(int), cudaMemcpyHostToDevice));
    printf("Copy page-locked: %12lld ns\n", tu_timer_stop());

    // Measure time to release page-lock on host data.
    tu_timer_start();
    cudaHostUnregister(locked);
    printf("Host unregister:  %12lld ns\n", tu_timer_stop());
  }

  return 0;
}
