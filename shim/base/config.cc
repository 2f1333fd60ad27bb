// config: parsing of the LAZYPIN_* variables (see config.h). Standard
// library and fmt only: the shim links nothing that costs load time.
#include "config.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include "fmt/format.h"
#include "json.h"

namespace lazypin {
namespace {

std::string_view Strip(std::string_view t) {
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  return t;
}

std::string Lower(std::string_view t) {
  std::string out(Strip(t));
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Digits only, at most 19 of them (so the value fits in 63 bits).
std::optional<uint64_t> Digits(std::string_view t) {
  if (t.empty() || t.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : t) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

// The value as shown in a message: printable ASCII, escaped, at most 80 bytes.
std::string Shown(const char* raw) {
  std::string out;
  for (const char* p = raw; *p != '\0' && out.size() < 80; ++p) {
    const unsigned char c = static_cast<unsigned char>(*p);
    if (c == '"' || c == '\\') out += fmt::format("\\{}", static_cast<char>(c));
    else if (c < 0x20 || c >= 0x7f) out += fmt::format("\\x{:02x}", c);
    else out.push_back(static_cast<char>(c));
  }
  return out;
}

}  // namespace

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kOff: return "off";
    case Mode::kLog: return "log";
    case Mode::kDefer: return "defer";
  }
  return "log";
}

const char* WatchModeName(WatchMode mode) {
  switch (mode) {
    case WatchMode::kAuto: return "auto";
    case WatchMode::kKernel: return "kernel";
    case WatchMode::kHooks: return "hooks";
  }
  return "auto";
}

std::optional<WatchMode> ParseWatchMode(std::string_view text) {
  const std::string t = Lower(text);
  if (t == "auto") return WatchMode::kAuto;
  if (t == "kernel") return WatchMode::kKernel;
  if (t == "hooks") return WatchMode::kHooks;
  return std::nullopt;
}

const char* StackModeName(StackMode mode) {
  switch (mode) {
    case StackMode::kOff: return "0";
    case StackMode::kDriver: return "1";
    case StackMode::kAll: return "all";
  }
  return "1";
}

std::optional<StackMode> ParseStackMode(std::string_view text) {
  const std::string t = Lower(text);
  if (t == "all") return StackMode::kAll;
  const std::optional<bool> on = ParseBool(t);
  if (!on) return std::nullopt;
  return *on ? StackMode::kDriver : StackMode::kOff;
}

std::optional<Mode> ParseMode(std::string_view text) {
  const std::string t = Lower(text);
  if (t == "off") return Mode::kOff;
  if (t == "log") return Mode::kLog;
  if (t == "defer") return Mode::kDefer;
  return std::nullopt;
}

std::optional<bool> ParseBool(std::string_view text) {
  const std::string t = Lower(text);
  if (t == "1" || t == "yes" || t == "true" || t == "on") return true;
  if (t == "0" || t == "no" || t == "false" || t == "off") return false;
  return std::nullopt;
}

std::optional<int64_t> ParseCount(std::string_view text, int64_t max) {
  const std::optional<uint64_t> v = Digits(Strip(text));
  if (!v || *v > static_cast<uint64_t>(max)) return std::nullopt;
  return static_cast<int64_t>(*v);
}

std::optional<uint64_t> ParseSize(std::string_view text, uint64_t physical_ram) {
  const std::string_view t = Strip(text);
  size_t digits = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits]))) ++digits;
  const std::optional<uint64_t> number = Digits(t.substr(0, digits));
  if (!number) return std::nullopt;
  std::string suffix(t.substr(digits));  // no space allowed between number and unit
  for (char& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (suffix == "%") {
    if (*number < 1 || *number > 100) return std::nullopt;
    return static_cast<uint64_t>(static_cast<unsigned __int128>(physical_ram) * *number / 100);
  }
  if (suffix.size() >= 2 && suffix.compare(suffix.size() - 2, 2, "ib") == 0) suffix.resize(suffix.size() - 2);
  else if (suffix.size() >= 2 && suffix.back() == 'b') suffix.pop_back();
  int shift = 0;
  if (suffix.empty() || suffix == "b") shift = 0;
  else if (suffix == "k") shift = 10;
  else if (suffix == "m") shift = 20;
  else if (suffix == "g") shift = 30;
  else if (suffix == "t") shift = 40;
  else return std::nullopt;
  if (*number > (std::numeric_limits<uint64_t>::max() >> shift)) return std::nullopt;
  return *number << shift;
}


namespace {

std::string JsonBool(bool b) { return b ? "true" : "false"; }

// Stores `value` in `*field` if there is one.
template <typename Field, typename T>
bool Store(const std::optional<T>& value, Field* field) {
  if (!value) return false;
  *field = static_cast<Field>(*value);
  return true;
}

constexpr int64_t kMaxEntries = int64_t{1} << 30;
constexpr int64_t kMaxIdleMs = int64_t{1} << 40;

}  // namespace

const Option kOptions[] = {
    {"LAZYPIN_MODE", "mode", "log", "log", "off, log or defer (any case)",
     "off: pass everything through; log: time and log every call; defer: also keep "
     "unregistered memory registered in the pool",
     [](std::string_view t, uint64_t, Config* c) { return Store(ParseMode(t), &c->mode); },
     [](const Config& c) { return fmt::format("\"{}\"", ModeName(c.mode)); }},
    {"LAZYPIN_LOG", "log", "lazypin-%e-%h-%p.jsonl", "lazypin-%e-%h-%p.jsonl",
     "a file path (%p becomes the pid, %h the host, %e the program)",
     "where the log goes; never an existing file: a taken name gets a .1, .2, ... suffix",
     [](std::string_view t, uint64_t, Config* c) {
       if (t.empty()) return false;
       c->log_path = std::string(t);
       return true;
     },
     [](const Config& c) { return JsonString(c.log_path); }},
    {"LAZYPIN_LOG_MAX", "log_max", "256M", "256M",
     "a size in bytes with an optional K, M, G or T suffix, or 0",
     "bound on the log's size: past it, exact tallies take the place of per-call records; "
     "0: no bound",
     [](std::string_view t, uint64_t ram, Config* c) {
       if (t.find('%') != std::string_view::npos) return false;
       return Store(ParseSize(t, ram), &c->log_max);
     },
     [](const Config& c) { return std::to_string(c.log_max); }},
    {"LAZYPIN_SUMMARY", "summary", "1", "1", "0 or 1", "1: a summary on stderr at exit",
     [](std::string_view t, uint64_t, Config* c) { return Store(ParseBool(t), &c->summary); },
     [](const Config& c) { return JsonBool(c.summary); },
     OptionKind::kSwitch},
    {"LAZYPIN_POOL_BYTES", "pool_bytes", "25%", "25% of RAM",
     "a size in bytes with an optional K, M, G or T suffix (512M, 8G) or a percentage of RAM "
     "from 1% to 100% (25%)",
     "bound on the bytes the pool keeps registered",
     [](std::string_view t, uint64_t ram, Config* c) {
       return Store(ParseSize(t, ram), &c->pool_bytes);
     },
     [](const Config& c) { return std::to_string(c.pool_bytes); }},
    {"LAZYPIN_POOL_ENTRIES", "pool_entries", "65536", "65536",
     "a whole number from 0 to 1073741824",
     "bound on the registrations the pool keeps and, counted apart, on the blocks "
     "LAZYPIN_HOST_ALLOC_CACHE keeps",
     [](std::string_view t, uint64_t, Config* c) {
       return Store(ParseCount(t, kMaxEntries), &c->pool_entries);
     },
     [](const Config& c) { return std::to_string(c.pool_entries); }},
    {"LAZYPIN_IDLE_MS", "idle_ms", "10000", "10000",
     "a whole number from 0 to 1099511627776",
     "release what sat unused in the pool this long; 0: never",
     [](std::string_view t, uint64_t, Config* c) {
       return Store(ParseCount(t, kMaxIdleMs), &c->idle_ms);
     },
     [](const Config& c) { return std::to_string(c.idle_ms); }},
    {"LAZYPIN_CHECK_PFN", "check_pfn", "0", "0", "0 or 1",
     "1: check on every hit that the physical pages did not change (root)",
     [](std::string_view t, uint64_t, Config* c) { return Store(ParseBool(t), &c->check_pfn); },
     [](const Config& c) { return JsonBool(c.check_pfn); },
     OptionKind::kSwitch},
    {"LAZYPIN_RELEASE_AT_EXIT", "release_at_exit", "0", "0", "0 or 1",
     "1: unregister the pool one by one at exit",
     [](std::string_view t, uint64_t, Config* c) {
       return Store(ParseBool(t), &c->release_at_exit);
     },
     [](const Config& c) { return JsonBool(c.release_at_exit); },
     OptionKind::kSwitch},
    {"LAZYPIN_WATCH", "watch", "auto", "auto", "auto, kernel or hooks",
     "how lazypin sees pages change: the kernel watch where it can (auto), always (kernel), or "
     "never (hooks)",
     [](std::string_view t, uint64_t, Config* c) { return Store(ParseWatchMode(t), &c->watch); },
     [](const Config& c) { return fmt::format("\"{}\"", WatchModeName(c.watch)); }},
    {"LAZYPIN_DEFER_SHARED", "defer_shared", "0", "0", "0 or 1",
     "1: defer shared and file-backed pages too (only if no other process changes those files)",
     [](std::string_view t, uint64_t, Config* c) { return Store(ParseBool(t), &c->defer_shared); },
     [](const Config& c) { return JsonBool(c.defer_shared); },
     OptionKind::kSwitch},
    {"LAZYPIN_UNREGISTER_WAIT", "unregister_wait", "1", "1", "0 or 1",
     "1: a deferred unregister first waits for the work in flight, as the driver's unregister "
     "does; 0: it returns at once",
     [](std::string_view t, uint64_t, Config* c) {
       return Store(ParseBool(t), &c->unregister_wait);
     },
     [](const Config& c) { return JsonBool(c.unregister_wait); },
     OptionKind::kSwitch},
    {"LAZYPIN_STACKS", "stacks", "1", "1", "0, 1 or all",
     "which calls get a native stack (the report's call sites): 1: those that reached the "
     "driver; all: every call; 0: none",
     [](std::string_view t, uint64_t, Config* c) { return Store(ParseStackMode(t), &c->stacks); },
     [](const Config& c) { return fmt::format("\"{}\"", StackModeName(c.stacks)); }},
    {"LAZYPIN_PREFAULT", "prefault", "16", "16", "a whole number from 0 to 64",
     "defer mode: the most threads that fault in a first register of 64 MiB or more before "
     "the driver pins it; 0 or 1: none",
     [](std::string_view t, uint64_t, Config* c) {
       return Store(ParseCount(t, 64), &c->prefault_threads);
     },
     [](const Config& c) { return std::to_string(c.prefault_threads); }},
    {"LAZYPIN_PREFAULT_HUGE", "prefault_huge", "0", "0", "0 or 1",
     "1: ask for transparent huge pages where LAZYPIN_PREFAULT faults pages in; 0: only where "
     "the mapping already gets them",
     [](std::string_view t, uint64_t, Config* c) { return Store(ParseBool(t), &c->prefault_huge); },
     [](const Config& c) { return JsonBool(c.prefault_huge); },
     OptionKind::kSwitch},
    {"LAZYPIN_HOST_ALLOC_CACHE", "host_alloc_cache", "25%", "25% of RAM",
     "a size as LAZYPIN_POOL_BYTES accepts, or 0",
     "defer mode: bound on the bytes of pinned host blocks the program freed that lazypin keeps "
     "for reuse; 0: none",
     [](std::string_view t, uint64_t ram, Config* c) {
       return Store(ParseSize(t, ram), &c->host_alloc_bytes);
     },
     [](const Config& c) { return std::to_string(c.host_alloc_bytes); }},
    {"LAZYPIN_AUTOPIN", "autopin", "0", "0", "0 or 1",
     "1 (defer mode, kernel watch): pin the pageable memory of a large host-device copy "
     "through the pool, for the pinned rate",
     [](std::string_view t, uint64_t, Config* c) { return Store(ParseBool(t), &c->autopin); },
     [](const Config& c) { return JsonBool(c.autopin); },
     OptionKind::kSwitch},
    {"LAZYPIN_AUTOPIN_MIN", "autopin_min", "4M", "4M",
     "a size in bytes with an optional K, M, G or T suffix, at least 64K",
     "the smallest copy LAZYPIN_AUTOPIN pins (smaller ones stay on the driver's staging path, "
     "where pinning does not pay back)",
     [](std::string_view t, uint64_t ram, Config* c) {
       const std::optional<uint64_t> v = ParseSize(t, ram);
       if (!v || *v < (uint64_t{64} << 10) || t.find('%') != std::string_view::npos) return false;
       c->autopin_min = *v;
       return true;
     },
     [](const Config& c) { return std::to_string(c.autopin_min); }},
    {"LAZYPIN_AUTOPIN_BYTES", "autopin_bytes", "10%", "10% of RAM",
     "a size in bytes with an optional K, M, G or T suffix or a percentage of RAM from 1% "
     "to 100%",
     "bound on the bytes LAZYPIN_AUTOPIN keeps pinned at once, within LAZYPIN_POOL_BYTES; past "
     "it, copies stay pageable",
     [](std::string_view t, uint64_t ram, Config* c) {
       return Store(ParseSize(t, ram), &c->autopin_bytes);
     },
     [](const Config& c) { return std::to_string(c.autopin_bytes); }},
    {"LAZYPIN_AUTOPIN_AFTER", "autopin_after", "1", "1", "a whole number from 1 to 1000",
     "LAZYPIN_AUTOPIN pins a range at this copy of it (1: the first; 2: the second)",
     [](std::string_view t, uint64_t, Config* c) {
       const std::optional<int64_t> v = ParseCount(t, 1000);
       if (!v || *v < 1) return false;
       c->autopin_after = *v;
       return true;
     },
     [](const Config& c) { return std::to_string(c.autopin_after); }},
    {"LAZYPIN_REUSE_FREED", "reuse_freed", "5%", "5% of RAM",
     "0 (off), or a size in bytes with an optional K, M, G or T suffix or a percentage of RAM "
     "from 1% to 100%",
     "defer mode, glibc's malloc: bound on the bytes of freed blocks that stay registered for "
     "reuse; 0: none",
     [](std::string_view t, uint64_t ram, Config* c) {
       return Store(ParseSize(t, ram), &c->reuse_freed);
     },
     [](const Config& c) { return std::to_string(c.reuse_freed); }},
    {"LAZYPIN_KEEP_MARGIN", "keep_margin", "256M", "256M",
     "a size as LAZYPIN_POOL_BYTES accepts",
     "defer mode: the program's memory headroom under which lazypin keeps nothing the program "
     "gave back",
     [](std::string_view t, uint64_t ram, Config* c) {
       return Store(ParseSize(t, ram), &c->keep_margin);
     },
     [](const Config& c) { return std::to_string(c.keep_margin); }},
};
const size_t kOptionCount = sizeof(kOptions) / sizeof(kOptions[0]);

const char* const kToolVariables[] = {"LAZYPIN_LIB", "LAZYPIN_REPORT_PYTHON",
                                      "LAZYPIN_REPORT_NO_MATPLOTLIB", "LAZYPIN_REPORT_PRICES", nullptr};

namespace {

// Levenshtein distance, for "did you mean".
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

bool Known(std::string_view name) {
  for (size_t i = 0; i < kOptionCount; ++i) {
    if (name == kOptions[i].name) return true;
  }
  for (const char* const* v = kToolVariables; *v != nullptr; ++v) {
    if (name == *v) return true;
  }
  return false;
}

}  // namespace

ParsedConfig ParseConfig(const std::function<const char*(const char*)>& getenv,
                         uint64_t physical_ram, const char* const* environ) {
  ParsedConfig parsed;
  Config& c = parsed.config;
  for (size_t i = 0; i < kOptionCount; ++i) {
    const Option& o = kOptions[i];
    if (*o.fallback != '\0') o.parse(o.fallback, physical_ram, &c);
    const char* raw = getenv(o.name);
    if (raw == nullptr || o.parse(raw, physical_ram, &c)) continue;
    // A bad value is one message: "VAR=value ignored: what it accepts; using the default".
    parsed.errors.push_back(fmt::format("lazypin: {}=\"{}\" ignored: accepts {}; using {}",
                                        o.name, Shown(raw), o.accepts, o.shown));
  }
  // A pool bound above the memory (99999T) could never be reached: it is the
  // memory, and one line says so.
  if (physical_ram > 0 && c.pool_bytes > physical_ram) {
    parsed.errors.push_back(fmt::format("lazypin: LAZYPIN_POOL_BYTES=\"{}\" is more than this "
                                        "machine's memory; using the memory, {} bytes",
                                        Shown(getenv("LAZYPIN_POOL_BYTES")), physical_ram));
    c.pool_bytes = physical_ram;
  }
  for (const char* const* e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    if (name.substr(0, 8) != "LAZYPIN_" || Known(name)) continue;
    const Option* closest = &kOptions[0];
    for (size_t i = 1; i < kOptionCount; ++i) {
      if (EditDistance(name, kOptions[i].name) < EditDistance(name, closest->name)) {
        closest = &kOptions[i];
      }
    }
    parsed.errors.push_back(fmt::format("lazypin: {} is not a lazypin variable (ignored); did "
                                        "you mean {}?",
                                        Shown(std::string(name).c_str()), closest->name));
  }
  return parsed;
}

Config PeekConfig(const std::function<const char*(const char*)>& getenv,
                  std::initializer_list<std::string_view> names) {
  Config c;
  for (size_t i = 0; i < kOptionCount; ++i) {
    const Option& o = kOptions[i];
    if (std::find(names.begin(), names.end(), std::string_view(o.name)) == names.end()) continue;
    if (*o.fallback != '\0') o.parse(o.fallback, 0, &c);
    const char* raw = getenv(o.name);
    if (raw != nullptr) o.parse(raw, 0, &c);  // a row's parser stores nothing it refuses
  }
  return c;
}

std::string ConfigJson(const Config& config) {
  std::string out = "{";
  for (size_t i = 0; i < kOptionCount; ++i) {
    out += fmt::format("{}\"{}\":{}", i == 0 ? "" : ",", kOptions[i].key, kOptions[i].json(config));
  }
  return out + "}";
}

std::string OptionsMarkdown() {
  std::string out = "| variable | accepts | default | what it does |\n|---|---|---|---|\n";
  for (size_t i = 0; i < kOptionCount; ++i) {
    const Option& o = kOptions[i];
    out += fmt::format("| `{}` | {} | {} | {} |\n", o.name, o.accepts, o.shown, o.doc);
  }
  return out;
}

std::string OptionsJson() {
  std::string out = "{\"options\":[";
  for (size_t i = 0; i < kOptionCount; ++i) {
    const Option& o = kOptions[i];
    std::string flag = o.key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    out += fmt::format(
        "{}{{\"name\":{},\"key\":{},\"flag\":{},\"kind\":\"{}\",\"default\":{},\"shown\":{},"
        "\"accepts\":{},\"doc\":{}}}",
        i == 0 ? "" : ",", JsonString(o.name), JsonString(o.key), JsonString("--" + flag),
        o.kind == OptionKind::kSwitch ? "switch" : "value", JsonString(o.fallback),
        JsonString(o.shown), JsonString(o.accepts), JsonString(o.doc));
  }
  return out + "]}";
}

}  // namespace lazypin
