// config: parsing of the LAZYPIN_* variables (see config.h). Standard
// library and fmt only: the shim links nothing that costs load time.
#include "config.h"

#include <cctype>
#include <limits>

#include "fmt/format.h"
#include "log.h"  // ShortHostName

namespace lazypin {
namespace {

constexpr const char* kSizeAccepts =
    "accepts a size in bytes with an optional K, M, G or T suffix (512M, 8G) or a percentage of "
    "RAM from 1% to 100% (25%)";

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

std::string ExpandLogPath(std::string_view pattern, int pid) {
  std::string out;
  std::string host;  // looked up at the first %h
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      const char what = pattern[i + 1];
      if (what == 'p' || what == 'h' || what == '%') {
        if (what == 'p') out += std::to_string(pid);
        if (what == 'h') {
          if (host.empty()) host = ShortHostName();
          out += host;
        }
        if (what == '%') out.push_back('%');
        ++i;
        continue;
      }
    }
    out.push_back(pattern[i]);
  }
  return out;
}

ParsedConfig ParseConfig(const std::function<const char*(const char*)>& getenv,
                         uint64_t physical_ram) {
  ParsedConfig parsed;
  Config& c = parsed.config;
  c.pool_bytes = physical_ram / 4;

  // Each variable: if set, parse; else keep the default. A bad value is one
  // message: "VAR=value ignored: what it accepts; using the default".
  const auto apply = [&](const char* name, auto parse, auto& field, const char* accepts,
                         const char* shown_default) {
    const char* raw = getenv(name);
    if (raw == nullptr) return;
    auto value = parse(std::string_view(raw));
    if (value) {
      field = static_cast<std::remove_reference_t<decltype(field)>>(*value);
    } else {
      parsed.errors.push_back(fmt::format("lazypin: {}=\"{}\" ignored: {}; using {}", name,
                                          Shown(raw), accepts, shown_default));
    }
  };
  apply("LAZYPIN_MODE", ParseMode, c.mode, "accepts off, log or defer", "log");
  apply("LAZYPIN_SUMMARY", ParseBool, c.summary, "accepts 0 or 1", "1");
  apply("LAZYPIN_CHECK_PFN", ParseBool, c.check_pfn, "accepts 0 or 1", "0");
  apply("LAZYPIN_RELEASE_AT_EXIT", ParseBool, c.release_at_exit, "accepts 0 or 1", "0");
  apply("LAZYPIN_POOL_BYTES", [&](std::string_view t) { return ParseSize(t, physical_ram); },
        c.pool_bytes, kSizeAccepts, "25% of RAM");
  apply("LAZYPIN_POOL_ENTRIES", [](std::string_view t) { return ParseCount(t, int64_t{1} << 30); },
        c.pool_entries, "accepts a whole number from 0 to 1073741824", "65536");
  apply("LAZYPIN_IDLE_MS", [](std::string_view t) { return ParseCount(t, int64_t{1} << 40); },
        c.idle_ms, "accepts a whole number from 0 to 1099511627776", "10000");
  if (const char* log = getenv("LAZYPIN_LOG")) {
    if (*log == '\0') {
      parsed.errors.push_back(
          "lazypin: LAZYPIN_LOG=\"\" ignored: accepts a file path (%p becomes the pid); using "
          "lazypin-<program>-<pid>.jsonl");
    } else {
      c.log_path = log;
    }
  }
  return parsed;
}

}  // namespace lazypin
