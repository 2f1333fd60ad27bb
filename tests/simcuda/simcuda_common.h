// Shared helpers for the simulated CUDA driver and runtime (tests/simcuda).
// Header-only, no dependencies beyond libc/libstdc++.
#pragma once

#include <cstdlib>
#include <cstring>

#define SIMCUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace simcuda {

inline bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

inline double env_double(const char* name, double dflt) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  return end == v ? dflt : d;
}

}  // namespace simcuda
