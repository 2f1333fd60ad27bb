// path_runtime.cu: the path_* call sequence through the runtime symbols
// cudaHostRegister / cudaHostUnregister (built as path_runtime with static
// cudart, which reaches the driver through cuGetProcAddress, and as
// path_runtime_shared, whose cudaHostRegister an LD_PRELOAD library interposes).
//
// CLI: path_runtime   (no options)
// Prints the CALL lines of path_seq.h and "DONE calls=<n>"; "PATH runtime" on
// stderr. Exits 0 (setup failures exit 1).
#include "common.h"
#include "path_seq.h"

int main() {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  int rc = pathseq::run(
      "runtime",
      [](void* p, size_t n, unsigned f) { return static_cast<int>(cudaHostRegister(p, n, f)); },
      [](void* p) { return static_cast<int>(cudaHostUnregister(p)); });
  cudaGetLastError();  // the sequence leaves error codes behind on purpose
  return rc;
}
