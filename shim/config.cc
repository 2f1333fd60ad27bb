// config: parsing of the LAZYPIN_* variables (see config.h).
#include "config.h"

#include <cctype>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lazypin {

absl::string_view ModeName(Mode mode) {
  switch (mode) {
    case Mode::kOff: return "off";
    case Mode::kLog: return "log";
    case Mode::kDefer: return "defer";
  }
  return "log";
}

absl::StatusOr<Mode> ParseMode(absl::string_view text) {
  std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (t == "off") return Mode::kOff;
  if (t == "log") return Mode::kLog;
  if (t == "defer") return Mode::kDefer;
  return absl::InvalidArgumentError("accepts off, log or defer");
}

absl::StatusOr<bool> ParseBool(absl::string_view text) {
  std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (t == "1" || t == "yes" || t == "true" || t == "on") return true;
  if (t == "0" || t == "no" || t == "false" || t == "off") return false;
  return absl::InvalidArgumentError("accepts 0 or 1");
}

absl::StatusOr<int64_t> ParseCount(absl::string_view text, int64_t max) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  int64_t v = 0;
  if (t.empty() || !std::isdigit(static_cast<unsigned char>(t[0])) || !absl::SimpleAtoi(t, &v) ||
      v < 0 || v > max) {
    return absl::InvalidArgumentError(absl::StrCat("accepts a whole number from 0 to ", max));
  }
  return v;
}

absl::StatusOr<uint64_t> ParseSize(absl::string_view text, uint64_t physical_ram) {
  const auto bad = [] {
    return absl::InvalidArgumentError(
        "accepts a size in bytes with an optional K, M, G or T suffix (512M, 8G) or a "
        "percentage of RAM from 1% to 100% (25%)");
  };
  absl::string_view t = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits]))) ++digits;
  if (digits == 0 || digits > 19) return bad();
  uint64_t number = 0;
  if (!absl::SimpleAtoi(t.substr(0, digits), &number)) return bad();
  std::string suffix = absl::AsciiStrToUpper(t.substr(digits));
  if (suffix == "%") {
    if (number < 1 || number > 100) return bad();
    return physical_ram / 100 * number + physical_ram % 100 * number / 100;  // floor(ram*n/100)
  }
  if (suffix.size() >= 2 && suffix.substr(suffix.size() - 2) == "IB") suffix.resize(suffix.size() - 2);
  else if (suffix.size() >= 2 && suffix.back() == 'B') suffix.pop_back();
  int shift = 0;
  if (suffix.empty() || suffix == "B") shift = 0;
  else if (suffix == "K") shift = 10;
  else if (suffix == "M") shift = 20;
  else if (suffix == "G") shift = 30;
  else if (suffix == "T") shift = 40;
  else return bad();
  if (number > (std::numeric_limits<uint64_t>::max() >> shift)) return bad();
  return number << shift;
}

std::string ExpandLogPath(absl::string_view pattern, int pid) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'p') { absl::StrAppend(&out, pid); ++i; continue; }
      if (pattern[i + 1] == '%') { out.push_back('%'); ++i; continue; }
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

  // Each variable: if set, parse; on error record "VAR=value: what it accepts; using default".
  const auto apply = [&](const char* name, auto parse, auto& field, std::string shown_default) {
    const char* raw = getenv(name);
    if (raw == nullptr) return;
    auto value = parse(absl::string_view(raw));
    if (value.ok()) {
      field = *value;
    } else {
      parsed.errors.push_back(absl::StrFormat("lazypin: %s=\"%s\" ignored: %s; using %s", name,
                                              absl::CHexEscape(raw).substr(0, 80),
                                              value.status().message(), shown_default));
    }
  };
  apply("LAZYPIN_MODE", ParseMode, c.mode, "log");
  apply("LAZYPIN_SUMMARY", ParseBool, c.summary, "1");
  apply("LAZYPIN_CHECK_PFN", ParseBool, c.check_pfn, "0");
  apply("LAZYPIN_RELEASE_AT_EXIT", ParseBool, c.release_at_exit, "0");
  apply("LAZYPIN_POOL_BYTES", [&](absl::string_view t) { return ParseSize(t, physical_ram); },
        c.pool_bytes, "25% of RAM");
  uint64_t entries = c.pool_entries;
  apply("LAZYPIN_POOL_ENTRIES",
        [](absl::string_view t) -> absl::StatusOr<uint64_t> {
          auto v = ParseCount(t, int64_t{1} << 30);
          if (!v.ok()) return v.status();
          return static_cast<uint64_t>(*v);
        },
        entries, "65536");
  c.pool_entries = entries;
  apply("LAZYPIN_IDLE_MS", [](absl::string_view t) { return ParseCount(t, int64_t{1} << 40); },
        c.idle_ms, "10000");
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
