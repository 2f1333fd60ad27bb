// lazypin-options: the option table and the log's name, as `lazypin run`
// needs them, from the library's own code (config.h, log.h), so that the
// runner defines none of it again. Not preloaded, not part of the shim.
//   lazypin-options table          {"options":[...],"host":...}: the flags, their help
//   lazypin-options check          the LAZYPIN_* variables of its environment, as the
//                                  shim would read them: {"errors":[...],"log":{...}}
//   lazypin-options glob PATTERN [PID]    LogPathGlob
//   lazypin-options expand PATTERN PID    ExpandLogPath (this program's name for %e)
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <string_view>

#include "config.h"
#include "fmt/format.h"
#include "json.h"
#include "log.h"

namespace lazypin {
namespace {

int Usage() {
  fprintf(stderr, "usage: lazypin-options table | check | glob PATTERN [PID] | expand PATTERN PID\n");
  return 2;
}

// The variables of this process's environment that a row refuses, and where
// the log would go: {"errors":[{"name","value","accepts","shown"}...],
// "log":{"pattern","glob","shown","problem"}}. `problem`: CheckLogPath's
// line for this process's expansion of the pattern, "" when a log can be made.
std::string Check() {
  std::string errors;
  for (size_t i = 0; i < kOptionCount; ++i) {
    const Option& o = kOptions[i];
    const char* raw = getenv(o.name);
    Config scratch;
    if (raw == nullptr || o.parse(raw, uint64_t{1} << 40, &scratch)) continue;
    errors += fmt::format("{}{{\"name\":{},\"value\":{},\"accepts\":{},\"shown\":{}}}",
                          errors.empty() ? "" : ",", JsonString(o.name), JsonString(raw),
                          JsonString(o.accepts), JsonString(o.shown));
  }
  const Config config = PeekConfig([](const char* name) { return getenv(name); }, {"LAZYPIN_LOG"});
  const std::string& pattern = config.log_path;
  const std::string shown = ExpandLogPattern(pattern, {"<pid>", ShortHostName(), "<program>"});
  return fmt::format("{{\"errors\":[{}],\"log\":{{\"pattern\":{},\"glob\":{},\"shown\":{},"
                     "\"problem\":{}}}}}",
                     errors, JsonString(pattern), JsonString(LogPathGlob(pattern)),
                     JsonString(shown), JsonString(CheckLogPath(ExpandLogPath(pattern, getpid()))));
}

int Main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const std::string_view what = argv[1];
  std::string out;
  if (what == "table" && argc == 2) {
    out = OptionsJson();
    out.insert(out.size() - 1, fmt::format(",\"host\":{}", JsonString(ShortHostName())));
  } else if (what == "check" && argc == 2) {
    out = Check();
  } else if (what == "glob" && (argc == 3 || argc == 4)) {
    out = LogPathGlob(argv[2], argc == 4 ? atoi(argv[3]) : 0);
  } else if (what == "expand" && argc == 4) {
    out = ExpandLogPath(argv[2], atoi(argv[3]));
  } else {
    return Usage();
  }
  printf("%s\n", out.c_str());
  return fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace
}  // namespace lazypin

int main(int argc, char** argv) { return lazypin::Main(argc, argv); }
