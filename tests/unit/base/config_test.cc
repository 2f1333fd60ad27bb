// Tests of the LAZYPIN_* parsing (shim/base/config.h), through an injected getenv.
#include "config.h"

#include <stdio.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lazypin {
namespace {

constexpr uint64_t kRam = uint64_t{16} << 30;  // 16 GiB
constexpr uint64_t kK = 1024, kM = kK << 10, kG = kM << 10, kT = kG << 10;

ParsedConfig Parse(const std::map<std::string, std::string>& env) {
  return ParseConfig(
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      kRam);
}

TEST(ConfigTest, DefaultsWhenNothingIsSet) {
  const ParsedConfig p = Parse({});
  EXPECT_TRUE(p.errors.empty());
  const Config& c = p.config;
  EXPECT_EQ(c.mode, Mode::kLog);
  EXPECT_EQ(c.log_path, "lazypin-%e-%h-%p.jsonl");
  EXPECT_TRUE(c.summary);
  EXPECT_EQ(c.pool_bytes, kRam / 4);
  EXPECT_EQ(c.pool_entries, 65536u);
  EXPECT_EQ(c.idle_ms, 10000);
  EXPECT_FALSE(c.check_pfn);
  EXPECT_FALSE(c.release_at_exit);
  EXPECT_TRUE(c.unregister_wait);
}

TEST(ConfigTest, ModesAreCaseInsensitive) {
  const std::pair<const char*, Mode> cases[] = {
      {"off", Mode::kOff},    {"OFF", Mode::kOff},     {"log", Mode::kLog},
      {"Log", Mode::kLog},    {"defer", Mode::kDefer}, {"DeFeR", Mode::kDefer},
      {" defer ", Mode::kDefer}};
  for (const auto& [text, mode] : cases) {
    SCOPED_TRACE(text);
    const ParsedConfig p = Parse({{"LAZYPIN_MODE", text}});
    EXPECT_TRUE(p.errors.empty());
    EXPECT_EQ(p.config.mode, mode);
  }
  EXPECT_STREQ(ModeName(Mode::kDefer), "defer");
  EXPECT_STREQ(ModeName(Mode::kOff), "off");
  EXPECT_STREQ(ModeName(Mode::kLog), "log");
}

TEST(ConfigTest, ValidSizes) {
  const std::pair<const char*, uint64_t> cases[] = {
      {"512M", 512 * kM}, {"8G", 8 * kG},       {"8g", 8 * kG},         {"1T", kT},
      {"4K", 4 * kK},     {"4KB", 4 * kK},      {"4KiB", 4 * kK},       {"4kib", 4 * kK},
      {"12345", 12345},   {"12345B", 12345},    {"0", 0},               {" 2G ", 2 * kG},
      {"25%", kRam / 4},  {"100%", kRam},       {"1%", kRam / 100},
      {"16777215T", 16777215 * kT},  // the largest T that fits in 64 bits
      {"99999T", 99999 * kT}};
  for (const auto& [text, bytes] : cases) {
    SCOPED_TRACE(text);
    const ParsedConfig p = Parse({{"LAZYPIN_POOL_BYTES", text}});
    if (bytes <= kRam) {
      EXPECT_TRUE(p.errors.empty()) << (p.errors.empty() ? "" : p.errors[0]);
      EXPECT_EQ(p.config.pool_bytes, bytes);
    } else {  // more than the memory: the memory, and one line saying so
      ASSERT_EQ(p.errors.size(), 1u);
      EXPECT_NE(p.errors[0].find("LAZYPIN_POOL_BYTES=\"" + std::string(text) + "\" is more than this "
                                 "machine's memory; using the memory, " + std::to_string(kRam)),
                std::string::npos) << p.errors[0];
      EXPECT_EQ(p.config.pool_bytes, kRam);
    }
    auto direct = ParseSize(text, kRam);
    ASSERT_TRUE(direct.has_value());
    EXPECT_EQ(*direct, bytes);
  }
}

TEST(ConfigTest, ValidBooleansCountsAndLogPath) {
  for (const char* yes : {"1", "yes", "YES", "true", "on"}) {
    SCOPED_TRACE(yes);
    const ParsedConfig p = Parse({{"LAZYPIN_SUMMARY", "0"},
                                  {"LAZYPIN_CHECK_PFN", yes},
                                  {"LAZYPIN_RELEASE_AT_EXIT", yes}});
    EXPECT_TRUE(p.errors.empty());
    EXPECT_TRUE(p.config.unregister_wait);
    EXPECT_FALSE(p.config.summary);
    EXPECT_TRUE(p.config.check_pfn);
    EXPECT_TRUE(p.config.release_at_exit);
  }
  for (const char* no : {"0", "no", "No", "false", "off"}) {
    SCOPED_TRACE(no);
    const ParsedConfig p = Parse({{"LAZYPIN_SUMMARY", no}, {"LAZYPIN_UNREGISTER_WAIT", no}});
    EXPECT_TRUE(p.errors.empty());
    EXPECT_FALSE(p.config.summary);
    EXPECT_FALSE(p.config.unregister_wait);
  }
  const ParsedConfig p = Parse({{"LAZYPIN_POOL_ENTRIES", "100"},
                                {"LAZYPIN_IDLE_MS", "0"},
                                {"LAZYPIN_LOG", "/tmp/x-%p.jsonl"}});
  EXPECT_TRUE(p.errors.empty());
  EXPECT_EQ(p.config.pool_entries, 100u);
  EXPECT_EQ(p.config.idle_ms, 0);
  EXPECT_EQ(p.config.log_path, "/tmp/x-%p.jsonl") << "expanded later, per process";
  EXPECT_EQ(Parse({{"LAZYPIN_POOL_ENTRIES", "1073741824"}}).config.pool_entries, 1u << 30);
  EXPECT_EQ(Parse({{"LAZYPIN_IDLE_MS", "1099511627776"}}).config.idle_ms, int64_t{1} << 40);
}

struct Hostile {
  const char* var;
  const char* value;
  const char* accepts;  // a phrase the message must contain
};

TEST(ConfigTest, HostileValuesGiveOneClearErrorAndKeepTheDefault) {
  const Config defaults = Parse({}).config;
  const Hostile cases[] = {
      {"LAZYPIN_MODE", "", "off, log or defer"},
      {"LAZYPIN_MODE", "deferred", "off, log or defer"},
      {"LAZYPIN_MODE", "1", "off, log or defer"},
      {"LAZYPIN_SUMMARY", "", "0 or 1"},
      {"LAZYPIN_SUMMARY", "2", "0 or 1"},
      {"LAZYPIN_CHECK_PFN", "maybe", "0 or 1"},
      {"LAZYPIN_RELEASE_AT_EXIT", "-1", "0 or 1"},
      {"LAZYPIN_POOL_BYTES", "", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "-1", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "-8G", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "abc", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "G", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "8X", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "8 G", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "1.5G", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "8GG", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "0x10", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "99999999999999999999G", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "99999999999999999999", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "18446744073709551616", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "16777216T", "K, M, G or T"},  // 2^64: overflow by the shift
      {"LAZYPIN_POOL_BYTES", "17179869184G", "K, M, G or T"},
      {"LAZYPIN_POOL_BYTES", "0%", "1% to 100%"},
      {"LAZYPIN_POOL_BYTES", "101%", "1% to 100%"},
      {"LAZYPIN_POOL_BYTES", "%", "1% to 100%"},
      {"LAZYPIN_POOL_BYTES", "25%%", "1% to 100%"},
      {"LAZYPIN_POOL_ENTRIES", "", "whole number"},
      {"LAZYPIN_POOL_ENTRIES", "-5", "whole number"},
      {"LAZYPIN_POOL_ENTRIES", "+5", "whole number"},
      {"LAZYPIN_POOL_ENTRIES", "ten", "whole number"},
      {"LAZYPIN_POOL_ENTRIES", "1e3", "whole number"},
      {"LAZYPIN_POOL_ENTRIES", "1073741825", "whole number"},
      {"LAZYPIN_POOL_ENTRIES", "99999999999999999999", "whole number"},
      {"LAZYPIN_IDLE_MS", "-1", "whole number"},
      {"LAZYPIN_IDLE_MS", "10s", "whole number"},
      {"LAZYPIN_IDLE_MS", "1099511627777", "whole number"},
      {"LAZYPIN_LOG", "", "file path"},
  };
  for (const Hostile& h : cases) {
    SCOPED_TRACE(std::string(h.var) + "=\"" + h.value + "\"");
    const ParsedConfig p = Parse({{h.var, h.value}});
    ASSERT_EQ(p.errors.size(), 1u);
    const std::string& e = p.errors[0];
    EXPECT_NE(e.find(h.var), std::string::npos) << e;
    EXPECT_NE(e.find(h.accepts), std::string::npos) << e;
    EXPECT_NE(e.find("accepts"), std::string::npos) << e;
    EXPECT_NE(e.find("using"), std::string::npos) << "names the default: " << e;
    const Config& c = p.config;
    EXPECT_EQ(c.mode, defaults.mode);
    EXPECT_EQ(c.log_path, defaults.log_path);
    EXPECT_EQ(c.summary, defaults.summary);
    EXPECT_EQ(c.pool_bytes, defaults.pool_bytes);
    EXPECT_EQ(c.pool_entries, defaults.pool_entries);
    EXPECT_EQ(c.idle_ms, defaults.idle_ms);
    EXPECT_EQ(c.check_pfn, defaults.check_pfn);
    EXPECT_EQ(c.release_at_exit, defaults.release_at_exit);
  }
}

TEST(ConfigTest, SeveralBadVariablesGiveOneErrorEachAndGoodOnesStillApply) {
  const ParsedConfig p = Parse({{"LAZYPIN_MODE", "defer"},
                                {"LAZYPIN_POOL_BYTES", "lots"},
                                {"LAZYPIN_POOL_ENTRIES", "-1"},
                                {"LAZYPIN_IDLE_MS", "500"}});
  ASSERT_EQ(p.errors.size(), 2u);
  EXPECT_NE(p.errors[0].find("LAZYPIN_POOL_BYTES"), std::string::npos);
  EXPECT_NE(p.errors[1].find("LAZYPIN_POOL_ENTRIES"), std::string::npos);
  EXPECT_EQ(p.config.mode, Mode::kDefer);
  EXPECT_EQ(p.config.idle_ms, 500);
}

TEST(ConfigTest, ErrorMessagesEscapeAndTruncateTheValue) {
  const ParsedConfig p = Parse({{"LAZYPIN_MODE", "de\nfer\"\x1b[31m"}});
  ASSERT_EQ(p.errors.size(), 1u);
  for (char ch : p.errors[0]) {
    EXPECT_GE(static_cast<unsigned char>(ch), 0x20) << "a control character in the message";
  }
  const ParsedConfig big = Parse({{"LAZYPIN_POOL_BYTES", std::string(100000, '9') + "G"}});
  ASSERT_EQ(big.errors.size(), 1u);
  EXPECT_LT(big.errors[0].size(), 400u);
  EXPECT_EQ(big.config.pool_bytes, kRam / 4);
}

TEST(ConfigTest, SingleValueParsers) {
  EXPECT_FALSE(ParseCount("", 10).has_value());
  EXPECT_FALSE(ParseCount("11", 10).has_value());
  EXPECT_EQ(*ParseCount("10", 10), 10);
  EXPECT_EQ(*ParseCount(" 7 ", 10), 7);
  EXPECT_TRUE(*ParseBool("On"));
  EXPECT_FALSE(ParseBool("").has_value());
  EXPECT_FALSE(ParseMode("").has_value());
  EXPECT_EQ(*ParseSize("50%", 1000), 500u);
  EXPECT_EQ(*ParseSize("33%", 1000), 330u);
}

TEST(ConfigTest, UnknownLazypinVariablesGetOneWarningNamingTheClosest) {
  const char* const environ[] = {"LAZYPIN_POOL_BYTE=8G", "LAZYPIN_MOD=defer", "LAZYPIN_LIB=/x.so",
                                 "PATH=/bin", "LAZYPIN_MODE=log", nullptr};
  const ParsedConfig p = ParseConfig([](const char*) -> const char* { return nullptr; }, kRam,
                                     environ);
  ASSERT_EQ(p.errors.size(), 2u);
  EXPECT_NE(p.errors[0].find("LAZYPIN_POOL_BYTE is not a lazypin variable"), std::string::npos)
      << p.errors[0];
  EXPECT_NE(p.errors[0].find("did you mean LAZYPIN_POOL_BYTES?"), std::string::npos) << p.errors[0];
  EXPECT_NE(p.errors[1].find("did you mean LAZYPIN_MODE?"), std::string::npos) << p.errors[1];
}

TEST(ConfigTest, TheHeaderConfigHasOneKeyPerOption) {
  Config c = Parse({{"LAZYPIN_MODE", "defer"}, {"LAZYPIN_LOG", "a\"b.jsonl"}}).config;
  const std::string json = ConfigJson(c);
  EXPECT_EQ(json,
            R"({"mode":"defer","log":"a\"b.jsonl","log_max":268435456,"summary":true,"pool_bytes":4294967296,)"
            R"("pool_entries":65536,"idle_ms":10000,"check_pfn":false,"release_at_exit":false,)"
            R"("watch":"auto","defer_shared":false,"unregister_wait":true,"stacks":"1","prefault":16,)"
            R"("prefault_huge":false,)"
            R"("host_alloc_cache":4294967296,"autopin":false,)"
            R"("autopin_min":4194304,"autopin_bytes":1717986918,"autopin_after":1,)"
            R"("reuse_freed":858993459,"keep_margin":268435456})");
}

TEST(ConfigTest, PeekConfigReadsOnlyTheNamedRows) {
  auto env = [](const char* autopin, const char* mode) {
    return [autopin, mode](const char* name) -> const char* {
      if (std::string_view(name) == "LAZYPIN_AUTOPIN") return autopin;
      if (std::string_view(name) == "LAZYPIN_MODE") return mode;
      return "garbage";
    };
  };
  EXPECT_TRUE(PeekConfig(env("1", nullptr), {"LAZYPIN_AUTOPIN"}).autopin);
  EXPECT_TRUE(PeekConfig(env(" yes ", nullptr), {"LAZYPIN_AUTOPIN"}).autopin);
  EXPECT_FALSE(PeekConfig(env("0", nullptr), {"LAZYPIN_AUTOPIN"}).autopin);
  EXPECT_FALSE(PeekConfig(env("maybe", nullptr), {"LAZYPIN_AUTOPIN"}).autopin);
  EXPECT_FALSE(PeekConfig(env(nullptr, nullptr), {"LAZYPIN_AUTOPIN"}).autopin);
  // The mode as ParseMode reads it (case and spaces too); its default (log)
  // where unset or not acceptable.
  EXPECT_EQ(PeekConfig(env(nullptr, "defer"), {"LAZYPIN_MODE"}).mode, Mode::kDefer);
  EXPECT_EQ(PeekConfig(env(nullptr, " DEFER"), {"LAZYPIN_MODE"}).mode, Mode::kDefer);
  EXPECT_EQ(PeekConfig(env(nullptr, "Off"), {"LAZYPIN_MODE"}).mode, Mode::kOff);
  EXPECT_EQ(PeekConfig(env(nullptr, nullptr), {"LAZYPIN_MODE"}).mode, Mode::kLog);
  EXPECT_EQ(PeekConfig(env(nullptr, "fast"), {"LAZYPIN_MODE"}).mode, Mode::kLog);
  // Rows not named are not read ("garbage" would be refused anyway).
  const Config both = PeekConfig(env("1", "defer"), {"LAZYPIN_MODE", "LAZYPIN_AUTOPIN"});
  EXPECT_TRUE(both.autopin);
  EXPECT_EQ(both.mode, Mode::kDefer);
  EXPECT_EQ(PeekConfig(env("1", "defer"), {"LAZYPIN_MODE"}).pool_entries, 0u);
}

TEST(ConfigTest, AutoPinIsOffByDefaultAndItsThresholdHasAFloor) {
  const ParsedConfig defaults = Parse({});
  EXPECT_FALSE(defaults.config.autopin);
  EXPECT_EQ(defaults.config.autopin_min, uint64_t{4} << 20);
  const ParsedConfig set = Parse({{"LAZYPIN_AUTOPIN", "1"}, {"LAZYPIN_AUTOPIN_MIN", "64K"},
                                  {"LAZYPIN_AUTOPIN_BYTES", "2G"}});
  EXPECT_TRUE(set.errors.empty());
  EXPECT_TRUE(set.config.autopin);
  EXPECT_EQ(set.config.autopin_min, uint64_t{64} << 10);
  EXPECT_EQ(set.config.autopin_bytes, uint64_t{2} << 30);
  for (const char* bad : {"63K", "1000", "5%", "x"}) {
    const ParsedConfig p = Parse({{"LAZYPIN_AUTOPIN_MIN", bad}});
    ASSERT_EQ(p.errors.size(), 1u) << bad;
    EXPECT_NE(p.errors[0].find("at least 64K"), std::string::npos) << p.errors[0];
    EXPECT_EQ(p.config.autopin_min, uint64_t{4} << 20) << "the default stays";
  }
}

std::string ReadSource(const char* relative) {
  const std::string path = std::string(LAZYPIN_SOURCE_DIR) + "/" + relative;
  FILE* f = fopen(path.c_str(), "r");
  EXPECT_NE(f, nullptr) << path;
  std::string text;
  char buf[4096];
  size_t n;
  while (f != nullptr && (n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  if (f != nullptr) fclose(f);
  return text;
}

TEST(ConfigTest, TheReadmeTableIsTheOptionTable) {
  const std::string readme = ReadSource("README.md");
  const std::string table = OptionsMarkdown();
  EXPECT_NE(readme.find(table), std::string::npos)
      << "README.md must hold the option table exactly as OptionsMarkdown() writes it:\n" << table;
  // Its cells stay one or two rendered lines; details go in the list below the table.
  size_t rows = 0;
  for (size_t at = readme.find("\n| `LAZYPIN_"); at != std::string::npos;
       at = readme.find("\n| `LAZYPIN_", at + 1)) {
    const size_t end = std::min(readme.find('\n', at + 1), readme.size());
    const std::string row = readme.substr(at + 3, end - at - 3 - 2);  // less "| " and " |"
    ++rows;
    for (size_t from = 0; from <= row.size();) {
      const size_t bar = std::min(row.find(" | ", from), row.size());
      EXPECT_LE(bar - from, 160u)
          << "a cell of README.md's option table: " << row.substr(from, bar - from);
      from = bar + 3;
    }
  }
  EXPECT_EQ(rows, kOptionCount);
}

// Every LAZYPIN_* name in `text`, whole (up to the first byte that cannot be
// part of a name), in order.
std::vector<std::string> VariableNames(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = text.find("LAZYPIN_"); at != std::string::npos; at = text.find("LAZYPIN_", at + 1)) {
    if (at > 0 && (std::isalnum(static_cast<unsigned char>(text[at - 1])) || text[at - 1] == '_')) {
      continue;
    }
    size_t end = at;
    while (end < text.size() &&
           (std::isupper(static_cast<unsigned char>(text[end])) ||
            std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '_')) {
      ++end;
    }
    out.push_back(text.substr(at, end - at));
  }
  return out;
}

bool KnownVariable(const std::string& name) {
  for (size_t i = 0; i < kOptionCount; ++i) {
    if (name == kOptions[i].name) return true;
  }
  for (const char* const* v = kToolVariables; *v != nullptr; ++v) {
    if (name == *v) return true;
  }
  return false;
}

TEST(ConfigTest, VariableNamesAreWhole) {
  EXPECT_EQ(VariableNames("LAZYPIN_AUTOPIN_MIN=4M, [LAZYPIN_AUTOPIN] xLAZYPIN_NO"),
            (std::vector<std::string>{"LAZYPIN_AUTOPIN_MIN", "LAZYPIN_AUTOPIN"}));
  EXPECT_FALSE(KnownVariable("LAZYPIN_AUTOPI"));
  EXPECT_FALSE(KnownVariable("LAZYPIN_AUTOPIN_"));
  EXPECT_TRUE(KnownVariable("LAZYPIN_AUTOPIN_MIN"));
}

// The runner's flags come from OptionsJson (tests/report checks `lazypin run
// --help` against it); what the runner names itself must be a whole, known name.
TEST(ConfigTest, TheRunnerAndTheReportNameOnlyKnownVariables) {
  std::vector<std::string> files = {"scripts/lazypin", "scripts/lazypin_report.py", "README.md"};
  for (const auto& entry : std::filesystem::directory_iterator(
           std::string(LAZYPIN_SOURCE_DIR) + "/scripts/lazypin_report")) {
    if (entry.path().extension() == ".py") {
      files.push_back("scripts/lazypin_report/" + entry.path().filename().string());
    }
  }
  EXPECT_GT(files.size(), 3u) << "the report's package, scripts/lazypin_report/";
  for (const std::string& file : files) {
    for (const std::string& name : VariableNames(ReadSource(file.c_str()))) {
      EXPECT_TRUE(KnownVariable(name)) << file << " names " << name << ", which is no variable";
    }
  }
}

TEST(ConfigTest, TheOptionsJsonHasEveryRowWithItsFlag) {
  const std::string json = OptionsJson();
  for (size_t i = 0; i < kOptionCount; ++i) {
    const Option& o = kOptions[i];
    std::string flag = std::string("--") + o.key;
    for (char& c : flag) c = c == '_' ? '-' : c;
    const std::string row = std::string("{\"name\":\"") + o.name + "\",\"key\":\"" + o.key +
                            "\",\"flag\":\"" + flag + "\",\"kind\":\"" +
                            (o.kind == OptionKind::kSwitch ? "switch" : "value") + "\"";
    EXPECT_NE(json.find(row), std::string::npos) << row << " not in " << json;
  }
  // A switch is exactly a row that accepts "0 or 1".
  for (size_t i = 0; i < kOptionCount; ++i) {
    const Option& o = kOptions[i];
    EXPECT_EQ(o.kind == OptionKind::kSwitch, std::string(o.accepts) == "0 or 1") << o.name;
  }
}

}  // namespace
}  // namespace lazypin
