// config: every LAZYPIN_* environment variable, parsed once into one struct.
// A bad value never stops the host program: it yields one clear message naming
// the variable and what it accepts, and the default is used instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lazypin {

enum class Mode { kOff, kLog, kDefer };
const char* ModeName(Mode mode);

// How lazypin learns that registered pages changed: the kernel watch
// (userfaultfd) behind the hooks when the kernel allows it (auto), the
// kernel watch or no deferral at all (kernel), or the hooks alone (hooks).
enum class WatchMode { kAuto, kKernel, kHooks };
const char* WatchModeName(WatchMode mode);

// Which calls carry their native stack (callsite.h): none, the calls that
// reached the driver (and lazypin's own releases on the program's threads),
// or every call, hits and deferrals included.
enum class StackMode { kOff, kDriver, kAll };
const char* StackModeName(StackMode mode);

// Every field's default is its option row's default text (kOptions), parsed.
struct Config {
  Mode mode = Mode::kOff;
  std::string log_path;           // empty: DefaultLogPattern (log.h) in the cwd
  bool summary = false;           // summary on stderr at exit
  uint64_t pool_bytes = 0;        // bound on pooled bytes
  uint64_t pool_entries = 0;      // bound on pooled registrations
  int64_t idle_ms = 0;            // collector: release what sat unused this long; 0 = never
  bool check_pfn = false;         // verify physical pages on every hit (root)
  bool release_at_exit = false;   // unregister the pool one by one at exit
  WatchMode watch = WatchMode::kAuto;
  bool defer_shared = false;      // defer shared and file-backed pages too
  bool unregister_wait = false;   // a deferred unregister waits for the work in flight first
  StackMode stacks = StackMode::kOff;
  int prefault_threads = 0;       // threads that fault a large miss's pages in first
  uint64_t host_alloc_bytes = 0;  // bound on freed pinned host blocks kept for reuse; 0: none
  bool autopin = false;           // pin pageable memory of large copies through the pool
  uint64_t autopin_min = 0;       // the smallest copy auto-pinned
  uint64_t autopin_bytes = 0;     // bound on the bytes auto-pinned at once
  int64_t autopin_after = 0;      // pin at this copy of a range
  uint64_t reuse_freed = 0;       // bytes of freed blocks kept registered for reuse; 0: off
};

// One row per LAZYPIN_* variable of the shim: the one place that names it,
// its default, what it accepts and what it does. The parser, its messages,
// the log header's "config" object and the README's table come from here
// (tests/unit/config_test.cc checks the README and `lazypin run --help`).
struct Option {
  const char* name;      // LAZYPIN_MODE
  const char* key;       // its key in the log header's "config" object
  const char* fallback;  // the default, as a value the variable accepts (or "" for none)
  const char* shown;     // the default as the docs and messages say it
  const char* accepts;   // what it accepts, as "accepts ..." continues
  const char* doc;       // one line: what it does
  // Parses `text` into `config`; false if the text is not acceptable.
  bool (*parse)(std::string_view text, uint64_t physical_ram, Config* config);
  // The field as a JSON value, for the log header.
  std::string (*json)(const Config& config);
};
extern const Option kOptions[];
extern const size_t kOptionCount;

// Variables named LAZYPIN_* that lazypin's tools read, not the shim (not warned about).
extern const char* const kToolVariables[];

// What ParseConfig found: the configuration and one message per bad variable
// (and per unknown LAZYPIN_* variable in `environ`).
struct ParsedConfig {
  Config config;
  std::vector<std::string> errors;
};

// `getenv` is injected so that tests need not touch the process environment;
// `environ` (null-terminated NAME=value strings, may be null) is scanned for
// unknown LAZYPIN_* names. `physical_ram` is the machine's RAM in bytes, for
// percentages.
ParsedConfig ParseConfig(const std::function<const char*(const char*)>& getenv,
                         uint64_t physical_ram, const char* const* environ = nullptr);

// Whether LAZYPIN_AUTOPIN (its kOptions row) asks for auto-pin. For the copy
// hooks, which set lazypin up on a large copy only then: a program may copy
// long before, or without, any register call, where lazypin otherwise starts.
bool AutoPinRequested(const std::function<const char*(const char*)>& getenv);

// The "config" object of the log header: one key per option row.
std::string ConfigJson(const Config& config);
// The README's table of variables, one row per option (markdown).
std::string OptionsMarkdown();

// Parsers for single values (empty when the text is not acceptable), exposed
// for tests. Sizes accept a plain number of bytes, a number with K/M/G/T
// (binary, optional trailing B or iB), or N% of RAM.
std::optional<uint64_t> ParseSize(std::string_view text, uint64_t physical_ram);
std::optional<int64_t> ParseCount(std::string_view text, int64_t max);
std::optional<bool> ParseBool(std::string_view text);
std::optional<Mode> ParseMode(std::string_view text);
std::optional<WatchMode> ParseWatchMode(std::string_view text);
std::optional<StackMode> ParseStackMode(std::string_view text);


}  // namespace lazypin
