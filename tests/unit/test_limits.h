// The configuration and limits the shim would use with no LAZYPIN_* variable
// set, on a machine of kTestRam (the option table's defaults, through
// ParseConfig and option_limits.h): what tests mean by the default bounds.
#pragma once

#include <cstdint>

#include "config.h"
#include "option_limits.h"

namespace lazypin {

constexpr uint64_t kTestRam = uint64_t{32} << 30;  // 25%: 8 GiB of pool

inline const Config& DefaultConfig() {
  static const Config config =
      ParseConfig([](const char*) -> const char* { return nullptr; }, kTestRam).config;
  return config;
}
inline PoolLimits DefaultPoolLimits() { return PoolLimitsFrom(DefaultConfig()); }
inline HostAllocLimits DefaultHostAllocLimits() { return HostAllocLimitsFrom(DefaultConfig()); }

}  // namespace lazypin
