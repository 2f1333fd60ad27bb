// config: every LAZYPIN_* environment variable, parsed once into one struct.
// A bad value never stops the host program: it yields one clear message naming
// the variable and what it accepts, and the default is used instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
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

// The values of the options. A default-constructed Config is not the default
// configuration: ParseConfig starts every field from its row's default
// (kOptions), and only those values are used.
struct Config {
  Mode mode = Mode::kOff;
  std::string log_path;           // the log path pattern (ExpandLogPath, log.h)
  uint64_t log_max = 0;           // bytes of per-call records in the log; 0: no bound
  bool summary = false;           // summary on stderr at exit
  uint64_t pool_bytes = 0;        // bound on the bytes the pool keeps registered
  uint64_t pool_entries = 0;      // bound on the pool's registrations, and on the host cache's blocks
  int64_t idle_ms = 0;            // collector: release what sat unused this long; 0 = never
  bool check_pfn = false;         // verify physical pages on every hit (root)
  bool release_at_exit = false;   // unregister the pool one by one at exit
  WatchMode watch = WatchMode::kAuto;
  bool defer_shared = false;      // defer shared and file-backed pages too
  bool unregister_wait = false;   // a deferred unregister waits for the work in flight first
  StackMode stacks = StackMode::kOff;
  int prefault_threads = 0;       // threads that fault a large miss's pages in first
  bool prefault_huge = false;     // ask for huge pages on the ranges they fault in
  uint64_t host_alloc_bytes = 0;  // bound on freed pinned host blocks kept for reuse; 0: none
  bool autopin = false;           // pin pageable memory of large copies through the pool
  uint64_t autopin_min = 0;       // the smallest copy auto-pinned
  uint64_t autopin_bytes = 0;     // bound on the bytes auto-pinned at once
  int64_t autopin_after = 0;      // pin at this copy of a range
  uint64_t reuse_freed = 0;       // bytes of freed blocks kept registered for reuse; 0: off
  uint64_t keep_margin = 0;       // headroom kept free for the program while lazypin keeps memory
};

// How `lazypin run` offers an option: a switch is `--KEY` (1) and `--no-KEY`
// (0), a value `--KEY VALUE` (KEY: the row's key, '_' written '-').
enum class OptionKind { kValue, kSwitch };

// One row per LAZYPIN_* variable of the shim: the one place that names it,
// its default, what it accepts and what it does. The parser, its messages,
// the log header's "config" object, the README's table and `lazypin run`'s
// flags and help (OptionsJson, through the lazypin-options tool) come from
// here (tests/unit/base/config_test.cc checks the README, tests/report the runner).
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
  OptionKind kind = OptionKind::kValue;
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

// The options named in `names` as their variables set them (each row's own
// parser; its default where unset or not acceptable; a share of RAM: 0);
// every other field as Config{} leaves it. No message. For what must be decided before
// set-up, which parses everything (ParseConfig) and says what was wrong:
// whether CUDA's start-up sets lazypin up (LAZYPIN_MODE), whether a large copy
// does (LAZYPIN_AUTOPIN).
Config PeekConfig(const std::function<const char*(const char*)>& getenv,
                  std::initializer_list<std::string_view> names);

// The "config" object of the log header: one key per option row.
std::string ConfigJson(const Config& config);
// The README's table of variables, one row per option (markdown).
std::string OptionsMarkdown();
// The table as JSON, for `lazypin run` (its flags, their help, which take a
// value): {"options":[{"name","key","flag","kind":"value"|"switch","default",
// "shown","accepts","doc"}...]}.
std::string OptionsJson();

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
