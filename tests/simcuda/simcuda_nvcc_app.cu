// simcuda_nvcc_app.cu: an ordinary CUDA program, built with
// `nvcc -arch=sm_90 -cudart shared` against the real toolkit, that must run
// unmodified on the sim (LD_LIBRARY_PATH=<build>/simcuda). Kernel bodies never
// execute on the sim; launches only occupy the stream.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

__device__ int g_counter;

__global__ void scale(float* p, int n, float f) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] *= f;
  if (i == 0) atomicAdd(&g_counter, 1);
}

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s: %s (%d)\n", #x, cudaGetErrorString(e_), (int)e_); \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int n = 1 << 20;
  std::vector<float> host(n), back(n);
  for (int i = 0; i < n; ++i) host[i] = static_cast<float>(i);
  CHECK(cudaHostRegister(host.data(), n * sizeof(float), cudaHostRegisterDefault));
  float* d = nullptr;
  CHECK(cudaMalloc(&d, n * sizeof(float)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaMemcpyAsync(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, s));
  scale<<<(n + 255) / 256, 256, 0, s>>>(d, n, 2.0f);
  CHECK(cudaGetLastError());
  scale<<<1, 32>>>(d, 32, 1.0f);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(back.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  // The kernel did not run (sim): the round trip must return the input.
  if (std::memcmp(host.data(), back.data(), n * sizeof(float)) != 0) {
    std::fprintf(stderr, "round trip mismatch\n");
    return 2;
  }
  cudaPointerAttributes a;
  CHECK(cudaPointerGetAttributes(&a, host.data()));
  if (a.type != cudaMemoryTypeHost) return 3;
  CHECK(cudaHostUnregister(host.data()));
  if (cudaHostUnregister(host.data()) != cudaErrorHostMemoryNotRegistered) return 4;
  (void)cudaGetLastError();
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d));
  CHECK(cudaDeviceSynchronize());
  std::printf("%s sm_%d%d: SIMCUDA_NVCC_APP_OK\n", prop.name, prop.major, prop.minor);
  return 0;
}
