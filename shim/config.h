// config: every LAZYPIN_* environment variable, parsed once into one struct.
// A bad value never stops the host program: it yields one clear message naming
// the variable and what it accepts, and the default is used instead.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lazypin {

enum class Mode { kOff, kLog, kDefer };
const char* ModeName(Mode mode);

struct Config {
  Mode mode = Mode::kLog;
  std::string log_path;           // empty: lazypin-<prog>-<pid>.jsonl in the cwd
  bool summary = true;            // summary on stderr at exit
  uint64_t pool_bytes = 0;        // resolved bound in bytes (default: 25% of RAM)
  uint64_t pool_entries = 65536;  // bound on pooled registrations
  int64_t idle_ms = 10000;        // collector: release what sat unused this long; 0 = never
  bool check_pfn = false;         // verify physical pages on every hit (root)
  bool release_at_exit = false;   // unregister the pool one by one at exit
};

// What ParseConfig found: the configuration and one message per bad variable.
struct ParsedConfig {
  Config config;
  std::vector<std::string> errors;
};

// `getenv` is injected so that tests need not touch the process environment.
// `physical_ram` is the machine's RAM in bytes, for percentages.
ParsedConfig ParseConfig(const std::function<const char*(const char*)>& getenv,
                         uint64_t physical_ram);

// Parsers for single values (empty when the text is not acceptable), exposed
// for tests. Sizes accept a plain number of bytes, a number with K/M/G/T
// (binary, optional trailing B or iB), or N% of RAM.
std::optional<uint64_t> ParseSize(std::string_view text, uint64_t physical_ram);
std::optional<int64_t> ParseCount(std::string_view text, int64_t max);
std::optional<bool> ParseBool(std::string_view text);
std::optional<Mode> ParseMode(std::string_view text);

// Expands a log path pattern: %p to `pid`, %h to ShortHostName() (log.h),
// %% to a literal %; any other %, and a trailing one, stay as they are.
std::string ExpandLogPath(std::string_view pattern, int pid);

}  // namespace lazypin
