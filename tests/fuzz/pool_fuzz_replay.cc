// A main() for the fuzz body (pool_fuzz.cc) where libFuzzer is not available:
//   pool_fuzz_replay [--max-inputs=N] [--max-seconds=S] [--seed=K]
//     runs pseudo-random inputs (random lengths up to 4 KiB) until either bound;
//   pool_fuzz_replay FILE...
//     runs each file once (a crash or corpus file from pool_fuzz).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  long max_inputs = 20000;
  double max_seconds = 10;
  uint64_t seed = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--max-inputs=", 13) == 0) max_inputs = std::atol(argv[i] + 13);
    else if (std::strncmp(argv[i], "--max-seconds=", 14) == 0) max_seconds = std::atof(argv[i] + 14);
    else if (std::strncmp(argv[i], "--seed=", 7) == 0) seed = std::strtoull(argv[i] + 7, nullptr, 10);
    else files.emplace_back(argv[i]);
  }
  if (!files.empty()) {
    for (const std::string& f : files) {
      std::ifstream in(f, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "pool_fuzz_replay: cannot read %s\n", f.c_str());
        return 2;
      }
      const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                       std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    }
    std::printf("pool_fuzz_replay: %zu file(s) passed\n", files.size());
    return 0;
  }
  std::mt19937_64 rng(seed);
  const auto start = std::chrono::steady_clock::now();
  long done = 0;
  uint64_t bytes_total = 0;
  std::vector<uint8_t> input;
  for (; done < max_inputs; ++done) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        max_seconds) {
      break;
    }
    input.resize(rng() % 4097);
    for (auto& b : input) b = static_cast<uint8_t>(rng());
    bytes_total += input.size();
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("pool_fuzz_replay: %ld inputs (%llu bytes) passed in %.1f s\n", done,
              static_cast<unsigned long long>(bytes_total),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return done > 0 ? 0 : 1;
}
