// memory_limit: how much memory this process may use: the machine's, or its
// cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes) when lower. What
// "N% of RAM" means in the options.
#pragma once

#include <cstdint>

namespace lazypin {

uint64_t MemoryForPercentages();

}  // namespace lazypin
