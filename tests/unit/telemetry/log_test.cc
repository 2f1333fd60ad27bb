// Tests of the log file's creation policy (shim/telemetry/log.h: CreateLogFile, Log::Open) and of the records (shim/telemetry/records.h),
// its default name and %-expansion (config.h: ExpandLogPath), and JSON string
// escaping (shim/base/json.h) against a table and, for random bytes, against
// Python's json and UTF-8 decoder.
#include "log.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <atomic>

#include "config.h"
#include "gtest/gtest.h"
#include "fmt/format.h"
#include "json.h"
#include "records.h"

namespace lazypin {
namespace {

// ------------------------------------------------------------- JsonString --

TEST(JsonStringTest, EscapesAndValidUtf8) {
  const std::pair<std::string, std::string> cases[] = {
      {"", R"("")"},
      {"plain", R"("plain")"},
      {"a\"b\\c", R"("a\"b\\c")"},
      {"l1\nl2\tx", R"("l1\nl2\tx")"},
      {std::string("\x00\x01\x1f\r\x7f", 5), R"("\u0000\u0001\u001f\u000d)" "\x7f\""},
      {"d\xc3\xa9" "fer", "\"d\xc3\xa9" "fer\""},                         // U+00E9
      {"\xe2\x82\xac", "\"\xe2\x82\xac\""},                               // U+20AC
      {"\xf0\x9f\x98\x80", "\"\xf0\x9f\x98\x80\""},                       // U+1F600
      {"\xed\x9f\xbf", "\"\xed\x9f\xbf\""},                               // U+D7FF
      {"\xee\x80\x80", "\"\xee\x80\x80\""},                               // U+E000
      {"\xf4\x8f\xbf\xbf", "\"\xf4\x8f\xbf\xbf\""},                       // U+10FFFF
      {"\xe2\x80\xa8", "\"\xe2\x80\xa8\""},                               // U+2028
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(JsonString(in), want) << in;
}

TEST(JsonStringTest, EachMaximalIllFormedSubsequenceBecomesOneReplacement) {
  const std::string R = "\xef\xbf\xbd";  // U+FFFD
  const std::pair<std::string, std::string> cases[] = {
      {"\xff\xfe", R + R},                           // bytes never in UTF-8
      {"\x80", R},                                   // a stray continuation
      {"a\xbf" "b", "a" + R + "b"},
      {"\xc0\xaf", R + R},                           // overlong '/'
      {"\xc1\xbf", R + R},
      {"\xe0\x80\xaf", R + R + R},                   // overlong, 3 bytes
      {"\xf0\x80\x80\xaf", R + R + R + R},           // overlong, 4 bytes
      {"\xed\xa0\x80", R + R + R},                   // U+D800, a surrogate
      {"\xed\xbf\xbf", R + R + R},                   // U+DFFF
      {"\xf4\x90\x80\x80", R + R + R + R},           // U+110000
      {"\xf5\x80\x80\x80", R + R + R + R},
      {"\xe2\x82", R},                               // cut short at the end
      {"\xe2\x82" "A", R + "A"},                     // cut short by ASCII
      {"\xf0\x9f\x98", R},
      {"\xf0\x9f\x98\xe2\x82\xac", R + "\xe2\x82\xac"},  // cut short by a valid sequence
      {"\xc3", R},
      {"\xc3\xc3\xa9", R + "\xc3\xa9"},
  };
  for (const auto& [in, want] : cases) {
    EXPECT_EQ(JsonString(in), "\"" + want + "\"") << testing::PrintToString(in);
  }
}

// Code points of `s` if it is well-formed UTF-8 (an independent decoder).
bool DecodeUtf8(const std::string& s, std::vector<uint32_t>* out) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (int k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    out->push_back(cp);
    i += n;
  }
  return true;
}

std::string RandomBytes(std::mt19937_64& rng) {
  // Biased to the bytes that make UTF-8 interesting.
  static constexpr unsigned char kPicks[] = {0x00, 0x0a, 0x1f, '"',  '\\', 'a',  0x7f, 0x80,
                                             0xbf, 0xc0, 0xc2, 0xdf, 0xe0, 0xed, 0xef, 0xf0,
                                             0xf4, 0xf5, 0xff, 0xa0, 0x9f, 0x90, 0x8f};
  std::string s(rng() % 24, '\0');
  for (char& c : s) {
    c = static_cast<char>(rng() % 3 == 0 ? static_cast<unsigned char>(rng())
                                         : kPicks[rng() % sizeof(kPicks)]);
  }
  return s;
}

TEST(JsonStringTest, RandomBytesGiveValidUtf8AndJsonStrings) {
  std::mt19937_64 rng(15);
  for (int round = 0; round < 100000; ++round) {
    const std::string in = RandomBytes(rng);
    const std::string out = JsonString(in);
    std::vector<uint32_t> cps;
    ASSERT_TRUE(DecodeUtf8(out, &cps)) << testing::PrintToString(in);
    ASSERT_GE(cps.size(), 2u);
    ASSERT_EQ(cps.front(), '"');
    ASSERT_EQ(cps.back(), '"');
    for (size_t i = 1; i + 1 < cps.size(); ++i) {
      ASSERT_GE(cps[i], 0x20u) << "a raw control character: " << testing::PrintToString(in);
      ASSERT_NE(cps[i], '"') << "an unescaped quote: " << testing::PrintToString(in);
      if (cps[i] == '\\') {
        ++i;
        ASSERT_LT(i + 1, cps.size());
        const uint32_t e = cps[i];
        ASSERT_TRUE(e == '"' || e == '\\' || e == 'n' || e == 't' || e == 'u') << e;
        if (e == 'u') {
          ASSERT_LT(i + 5, cps.size());
          for (int k = 1; k <= 4; ++k) ASSERT_TRUE(isxdigit(static_cast<int>(cps[i + k])));
          i += 4;
        }
      }
    }
  }
}

// The oracle: Python's json.loads of each output equals the input decoded
// with bytes.decode("utf-8", "replace").
TEST(JsonStringTest, PythonReadsBackWhatItsDecoderWouldReplace) {
  if (system("python3 -c pass >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  char dir_template[] = "/tmp/lazypin-json-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  std::mt19937_64 rng(17);
  {
    std::ofstream in(dir + "/in.hex"), out(dir + "/out.jsonl");
    for (int round = 0; round < 20000; ++round) {
      const std::string s = RandomBytes(rng);
      for (unsigned char c : s) in << "0123456789abcdef"[c >> 4] << "0123456789abcdef"[c & 15];
      in << "\n";
      out << JsonString(s) << "\n";
    }
  }
  const std::string script =
      "import json,sys\n"
      "d=sys.argv[1]\n"
      "ins=open(d+'/in.hex').read().split('\\n')[:-1]\n"
      "outs=open(d+'/out.jsonl',encoding='utf-8',errors='strict').read().split('\\n')[:-1]\n"
      "assert len(ins)==len(outs)==20000,(len(ins),len(outs))\n"
      "for h,o in zip(ins,outs):\n"
      "  want=bytes.fromhex(h).decode('utf-8','replace')\n"
      "  got=json.loads(o)\n"
      "  assert got==want,(h,o,want)\n"
      "print('checked',len(outs))\n";
  {
    std::ofstream(dir + "/check.py") << script;
  }
  const std::string cmd = "python3 " + dir + "/check.py " + dir + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string text;
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) text += buf;
  const int status = pclose(p);
  EXPECT_EQ(status, 0) << text;
  EXPECT_NE(text.find("checked 20000"), std::string::npos) << text;
  system(("rm -rf " + dir).c_str());
}

// ------------------------------------------------------- names, expansion --

TEST(LogNameTest, NamePartKeepsOnlySafeBytes) {
  EXPECT_EQ(LogNamePart("train.py"), "train.py");
  EXPECT_EQ(LogNamePart("my app/x%p"), "my_app_x_p");
  EXPECT_EQ(LogNamePart("A-z_0.9"), "A-z_0.9");
  EXPECT_EQ(LogNamePart("d\xc3\xa9"), "d__");
  EXPECT_EQ(LogNamePart(""), "unknown");
}

TEST(LogNameTest, ShortHostNameIsTheNodenameUpToItsFirstDot) {
  struct utsname u;
  ASSERT_EQ(uname(&u), 0);
  std::string node(u.nodename);
  node = node.substr(0, node.find('.'));
  EXPECT_EQ(ShortHostName(), LogNamePart(node));
  EXPECT_EQ(ShortHostName().find('.'), std::string::npos);
  EXPECT_FALSE(ShortHostName().empty());
}

TEST(LogNameTest, TheDefaultPatternNamesEachProcessAfterItsOwnProgram) {
  const ParsedConfig p = ParseConfig([](const char*) -> const char* { return nullptr; }, 1 << 30);
  EXPECT_EQ(p.config.log_path, "lazypin-%e-%h-%p.jsonl");
  EXPECT_EQ(ExpandLogPath(p.config.log_path, 42),
            "lazypin-" + LogNamePart(program_invocation_short_name) + "-" + ShortHostName() +
                "-42.jsonl");
  EXPECT_EQ(ExpandLogPattern(p.config.log_path, {"7", "h", "a_b_h"}), "lazypin-a_b_h-h-7.jsonl");
}

TEST(LogNameTest, ExpandLogPath) {
  const std::string h = ShortHostName();
  const std::string e = LogNamePart(program_invocation_short_name);
  EXPECT_EQ(ExpandLogPath("lp-%p.jsonl", 4242), "lp-4242.jsonl");
  EXPECT_EQ(ExpandLogPath("%h/%p-%h", 7), h + "/7-" + h);
  EXPECT_EQ(ExpandLogPath("%e-%p", 7), e + "-7");
  EXPECT_EQ(ExpandLogPath("100%%-%h", 7), "100%-" + h);
  EXPECT_EQ(ExpandLogPath("%%h%%p%%e", 7), "%h%p%e");
  EXPECT_EQ(ExpandLogPath("%%%h", 7), "%" + h);
  EXPECT_EQ(ExpandLogPath("a%", 7), "a%") << "a trailing % stays";
  EXPECT_EQ(ExpandLogPath("%h%", 7), h + "%");
  EXPECT_EQ(ExpandLogPath("%x%H%P%E", 7), "%x%H%P%E") << "unknown escapes stay";
  EXPECT_EQ(ExpandLogPath("", 7), "");
}

TEST(LogNameTest, TheGlobMatchesEveryExpansionAndEscapesWildcards) {
  const std::string h = ShortHostName();
  EXPECT_EQ(LogPathGlob("/l/lp-%e-%h-%p.jsonl"), "/l/lp-*-" + h + "-*.jsonl");
  EXPECT_EQ(LogPathGlob("/l/lp-%e-%h-%p.jsonl", 42), "/l/lp-*-" + h + "-42.jsonl");
  EXPECT_EQ(LogPathGlob("/l/[x]*?-%%-%p"), "/l/[[]x][*][?]-%-*");
  EXPECT_EQ(LogPathGlob("a%"), "a%");
}

// ---------------------------------------------------------- CreateLogFile --

class CreateLogFileTest : public testing::TestWithParam<LogPathResolver> {
 protected:
  void SetUp() override {
    char t[] = "/tmp/lazypin-log-XXXXXX";
    ASSERT_NE(mkdtemp(t), nullptr);
    dir_ = t;
  }
  void TearDown() override { system(("rm -rf " + dir_).c_str()); }

  std::string P(const std::string& rel) const { return dir_ + "/" + rel; }
  static void Put(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  }
  static std::string Get(const std::string& path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  // Creates, after CheckLogPath said what the create would say: nothing for
  // a create that works, its message for one refused (but for a name whose
  // every suffix is taken, which only the create finds out).
  CreatedLogFile Create(const std::string& path) {
    const std::string check = CheckLogPath(path, GetParam());
    CreatedLogFile f = CreateLogFile(path, GetParam());
    if (f.fd >= 0) fds_.push_back(f.fd);
    if (f.fd >= 0) {
      EXPECT_EQ(check, "") << path;
    } else if (f.message.find("File exists") == std::string::npos) {
      EXPECT_EQ(check, f.message) << path;
    }
    return f;
  }
  // Refused: no descriptor, one line naming LAZYPIN_LOG and containing `why`.
  void ExpectRefused(const CreatedLogFile& f, const std::string& why) {
    EXPECT_EQ(f.fd, -1);
    EXPECT_NE(f.message.find("LAZYPIN_LOG="), std::string::npos) << f.message;
    EXPECT_NE(f.message.find(why), std::string::npos) << f.message;
    EXPECT_NE(f.message.find("not writing a log file"), std::string::npos) << f.message;
    EXPECT_EQ(f.message.find('\n'), std::string::npos) << f.message;
    EXPECT_LT(f.message.size(), 400u) << f.message;
  }
  ~CreateLogFileTest() override {
    for (int fd : fds_) close(fd);
  }

  std::string dir_;
  std::vector<int> fds_;
};

TEST_P(CreateLogFileTest, NewFileIsCreatedMode0600Blocking) {
  const CreatedLogFile f = Create(P("lp.jsonl"));
  ASSERT_GE(f.fd, 0) << f.message;
  EXPECT_EQ(f.path, P("lp.jsonl"));
  EXPECT_EQ(f.message, "");
  struct stat st;
  ASSERT_EQ(fstat(f.fd, &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(fcntl(f.fd, F_GETFL) & O_NONBLOCK, 0) << "O_NONBLOCK is cleared";
  EXPECT_NE(fcntl(f.fd, F_GETFD) & FD_CLOEXEC, 0);
}

TEST_P(CreateLogFileTest, ExistingFileIsKeptAndTheLogGetsASuffix) {
  Put(P("same.jsonl"), "first\n");
  const CreatedLogFile a = Create(P("same.jsonl"));
  ASSERT_GE(a.fd, 0) << a.message;
  EXPECT_EQ(a.path, P("same.1.jsonl"));
  EXPECT_NE(a.message.find("this process logs to \"" + P("same.1.jsonl") + "\""), std::string::npos)
      << a.message;
  const CreatedLogFile b = Create(P("same.jsonl"));
  EXPECT_EQ(b.path, P("same.2.jsonl"));
  EXPECT_EQ(Get(P("same.jsonl")), "first\n");
  // Names without an extension, hidden names, the bound.
  Put(P("log"), "x");
  EXPECT_EQ(Create(P("log")).path, P("log.1"));
  Put(P(".log"), "x");
  EXPECT_EQ(Create(P(".log")).path, P(".log.1"));
  Put(P("full.jsonl"), "x");
  for (int n = 1; n <= 1000; ++n) Put(P("full." + std::to_string(n) + ".jsonl"), "x");
  const CreatedLogFile full = Create(P("full.jsonl"));
  EXPECT_EQ(full.fd, -1);
  EXPECT_NE(full.message.find("full.1000.jsonl"), std::string::npos) << full.message;
  EXPECT_NE(full.message.find("File exists"), std::string::npos) << full.message;
}

TEST_P(CreateLogFileTest, HardLinkToAUserFileIsNeverTouched) {
  Put(P("precious"), "precious\n");
  ASSERT_EQ(link(P("precious").c_str(), P("lp.jsonl").c_str()), 0);
  const CreatedLogFile f = Create(P("lp.jsonl"));
  ASSERT_GE(f.fd, 0);
  EXPECT_EQ(f.path, P("lp.1.jsonl"));
  ASSERT_EQ(write(f.fd, "x\n", 2), 2);
  EXPECT_EQ(Get(P("precious")), "precious\n");
}

TEST_P(CreateLogFileTest, FifoIsRefusedWithoutBlocking) {
  ASSERT_EQ(mkfifo(P("fifo").c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  const CreatedLogFile f = Create(P("fifo"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  ExpectRefused(f, "is a FIFO, not a regular file");
}

TEST_P(CreateLogFileTest, SocketDeviceAndDirectoryAreRefused) {
  const int s = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", P("sock").c_str());
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ExpectRefused(Create(P("sock")), "is a socket, not a regular file");
  close(s);
  ExpectRefused(Create("/dev/null"), "is a character device, not a regular file");
  mkdir(P("d").c_str(), 0700);
  ExpectRefused(Create(P("d")), "is a directory, not a regular file");
  ExpectRefused(Create(P("d/")), "names a directory");
  ExpectRefused(Create(P("d/..")), "names a directory");
  ExpectRefused(Create("/"), "names a directory");
}

TEST_P(CreateLogFileTest, SymlinkInTheLastComponentIsRefused) {
  Put(P("victim"), "precious\n");
  ASSERT_EQ(symlink(P("victim").c_str(), P("lp.jsonl").c_str()), 0);
  ExpectRefused(Create(P("lp.jsonl")), "goes through a symbolic link");
  ASSERT_EQ(symlink(P("nowhere").c_str(), P("dangling.jsonl").c_str()), 0);
  ExpectRefused(Create(P("dangling.jsonl")), "goes through a symbolic link");
  EXPECT_EQ(Get(P("victim")), "precious\n");
  struct stat st;
  EXPECT_NE(lstat(P("nowhere").c_str(), &st), 0) << "nothing created through the dangling link";
}

TEST_P(CreateLogFileTest, SymlinkInAMiddleComponentIsRefused) {
  mkdir(P("real").c_str(), 0700);
  mkdir(P("real/sub").c_str(), 0700);
  Put(P("real/sub/passwd"), "root:x:0:0\n");
  mkdir(P("dir").c_str(), 0700);
  ASSERT_EQ(symlink(P("real").c_str(), P("dir/link").c_str()), 0);
  const CreatedLogFile f = Create(P("dir/link/sub/passwd"));
  ExpectRefused(f, "goes through a symbolic link (\"" + P("dir/link") + "\")");
  EXPECT_EQ(Get(P("real/sub/passwd")), "root:x:0:0\n");
  // A new name behind the link is not created either.
  ExpectRefused(Create(P("dir/link/sub/new.jsonl")), "symbolic link");
  struct stat st;
  EXPECT_NE(stat(P("real/sub/new.jsonl").c_str(), &st), 0);
  // The message suggests the same place without the link.
  EXPECT_NE(f.message.find("such as"), std::string::npos) << f.message;
}

TEST_P(CreateLogFileTest, ProcFdMagicLinksAreRefused) {
  Put(P("target"), "precious\n");
  const int file = open(P("target").c_str(), O_RDWR);
  const int dir = open(dir_.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(file, 0);
  ASSERT_GE(dir, 0);
  // /proc/self is itself a link; /proc/<pid>/fd/N is a magic link.
  ExpectRefused(Create("/proc/self/fd/" + std::to_string(file)), "symbolic link");
  const std::string fds = "/proc/" + std::to_string(getpid()) + "/fd/";
  ExpectRefused(Create(fds + std::to_string(file)), "symbolic link");
  ExpectRefused(Create(fds + std::to_string(dir) + "/target"), "symbolic link");
  ExpectRefused(Create(fds + std::to_string(dir) + "/new.jsonl"), "symbolic link");
  close(file);
  close(dir);
  EXPECT_EQ(Get(P("target")), "precious\n");
  struct stat st;
  EXPECT_NE(stat(P("new.jsonl").c_str(), &st), 0);
}

TEST_P(CreateLogFileTest, RelativePathIsResolvedFromTheCurrentDirectoryEvenThroughALink) {
  // The current directory's own path is not examined: a cwd reached through
  // a link (a home directory that is a link) works; a link below it does not.
  mkdir(P("real").c_str(), 0700);
  ASSERT_EQ(symlink(P("real").c_str(), P("home").c_str()), 0);
  char old[PATH_MAX];
  ASSERT_NE(getcwd(old, sizeof(old)), nullptr);
  ASSERT_EQ(chdir(P("home").c_str()), 0);
  mkdir("sub", 0700);
  symlink("sub", "sublink");
  const CreatedLogFile a = Create("lp.jsonl");
  const CreatedLogFile b = Create("./sub/lp.jsonl");
  const CreatedLogFile c = Create("sublink/lp.jsonl");
  ASSERT_EQ(chdir(old), 0);
  ASSERT_GE(a.fd, 0) << a.message;
  EXPECT_EQ(a.path, "lp.jsonl");
  ASSERT_GE(b.fd, 0) << b.message;
  ExpectRefused(c, "goes through a symbolic link (\"sublink\")");
  struct stat st;
  EXPECT_EQ(stat(P("real/lp.jsonl").c_str(), &st), 0);
  EXPECT_EQ(stat(P("real/sub/lp.jsonl").c_str(), &st), 0);
}

TEST_P(CreateLogFileTest, MissingOrUnwritableDirectoryIsOneLine) {
  ExpectRefused(Create(P("missing/lp.jsonl")), "No such file or directory");
  ExpectRefused(Create(P(std::string(300, 'x') + "/lp.jsonl")), "File name too long");
  ExpectRefused(Create(P(std::string(10240, '9'))), "File name too long");
  Put(P("file"), "x");
  ExpectRefused(Create(P("file/lp.jsonl")), "Not a directory");
}

INSTANTIATE_TEST_SUITE_P(Resolvers, CreateLogFileTest,
                         testing::Values(LogPathResolver::kAuto, LogPathResolver::kWalk),
                         [](const testing::TestParamInfo<LogPathResolver>& info) {
                           return info.param == LogPathResolver::kAuto ? "openat2" : "walk";
                         });

// -------------------------------------------------------------------- Log --

TEST(LogTest, OpenWritesToTheSuffixedNameAndReportsIt) {
  char t[] = "/tmp/lazypin-log-XXXXXX";
  ASSERT_NE(mkdtemp(t), nullptr);
  const std::string dir = t, path = dir + "/same.jsonl";
  std::ofstream(path) << "{\"type\":\"header\"}\n";
  std::string error;
  testing::internal::CaptureStderr();
  std::unique_ptr<Log> log = Log::Open(path, &error);
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_NE(log, nullptr) << error;
  EXPECT_EQ(log->path(), dir + "/same.1.jsonl");
  EXPECT_EQ(err, "lazypin: LAZYPIN_LOG=\"" + path +
                     "\" exists (lazypin never overwrites a file); this process logs to \"" + dir +
                     "/same.1.jsonl\"\n");
  log->Write("{\"a\":1}");
  log->Close("{\"b\":2}");
  std::ifstream f(log->path());
  std::stringstream s;
  s << f.rdbuf();
  EXPECT_EQ(s.str(), "{\"a\":1}\n{\"b\":2}\n");
  std::unique_ptr<Log> refused = Log::Open("/dev/null", &error);
  EXPECT_EQ(refused, nullptr);
  EXPECT_NE(error.find("character device"), std::string::npos) << error;
  system(("rm -rf " + dir).c_str());
}

// Binary entries from many threads: every one reaches the Formatter once, in
// each thread's order, and is written before the last line, which is made
// after the Formatter saw them all; any the full ring dropped (a writer
// starved for the whole wait, on a loaded machine) are counted and said.
TEST(LogTest, EntriesFromManyThreadsAreFormattedOnceInOrder) {
  char t[] = "/tmp/lazypin-log-XXXXXX";
  ASSERT_NE(mkdtemp(t), nullptr);
  const std::string path = std::string(t) + "/ring.jsonl";
  std::atomic<int> formatted{0};
  std::unique_ptr<Log> log = Log::Deferred(path, [&](const LogEntry& e, std::string* line) {
    if (e.kind == LogEntry::Kind::kDropped) {
      *line = fmt::format("dropped {}", e.bytes);
      return;
    }
    formatted.fetch_add(1);
    *line = fmt::format("{} {}", e.tid, e.t_ns);
  });
  ASSERT_TRUE(log->Start([](const std::string&) { return std::vector<std::string>{"head"}; }));
  constexpr int kThreads = 4, kEach = 30000;  // more than the ring holds: the writer keeps up or they wait
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int n = 0; n < kEach; ++n) {
        LogEntry e;
        e.kind = LogEntry::Kind::kCall;
        e.tid = i;
        e.t_ns = n;
        log->Write(e);
      }
    });
  }
  for (auto& th : threads) th.join();
  log->Write("text");
  log->Close([&] { return fmt::format("last {}", formatted.load()); });
  std::ifstream f(log->path());
  std::string line;
  std::getline(f, line);
  EXPECT_EQ(line, "head");
  std::vector<int> next(kThreads, 0);
  int lines = 0;
  long dropped = 0;
  while (std::getline(f, line) && line.rfind("last", 0) != 0 && line != "text") {
    long d = 0;
    if (sscanf(line.c_str(), "dropped %ld", &d) == 1) {
      dropped += d;
      continue;
    }
    int tid = -1, n = -1;
    ASSERT_EQ(sscanf(line.c_str(), "%d %d", &tid, &n), 2) << line;
    ASSERT_GE(tid, 0);
    ASSERT_LT(tid, kThreads);
    EXPECT_GE(n, next[tid]) << "thread " << tid;
    next[tid] = n + 1;
    ++lines;
  }
  EXPECT_EQ(lines + dropped, kThreads * kEach);
  EXPECT_EQ(lines, formatted.load());
  EXPECT_EQ(line, "text");
  std::getline(f, line);
  EXPECT_EQ(line, fmt::format("last {}", lines));
  system((std::string("rm -rf ") + t).c_str());
}

// With no writer to take them, a full ring drops records at once (no wait)
// and counts them: the Formatter is told how many (kDropped) when they are
// finally taken, so that the log says so.
TEST(LogTest, AFullRingWithoutAWriterCountsWhatItDrops) {
  uint64_t dropped = 0;
  int calls = 0;
  std::unique_ptr<Log> log =
      Log::Deferred("/nonexistent-dir/x.jsonl", [&](const LogEntry& e, std::string* line) {
        if (e.kind == LogEntry::Kind::kDropped) dropped += e.bytes;
        if (e.kind == LogEntry::Kind::kCall) ++calls;
        *line = "x";
      });
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < LogRing::kSlots + 100; ++i) {
    LogEntry e;
    e.kind = LogEntry::Kind::kCall;
    log->Write(e);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  log->Close();
  EXPECT_EQ(calls, static_cast<int>(LogRing::kSlots));
  EXPECT_EQ(dropped, 100u);
}

}  // namespace
}  // namespace lazypin

// ------------------------------------------------------------- records --

namespace lazypin {
namespace {

// The call and evict records (formatted on the stack) are byte for byte what fmt's "{}"
// gives for the log format's templates (docs/log-format.md), at the edges too.
TEST(RecordsTest, CallAndEvictRecordsAreWhatFmtWrites) {
  const int64_t times[] = {0, 1, 123456789, INT64_MAX, -5, INT64_MIN};
  const uintptr_t ptrs[] = {0, 0x1000, 0x7f12a4000000, UINTPTR_MAX};
  for (int64_t t : times) {
    for (uintptr_t p : ptrs) {
      for (PassReason reason : {PassReason::kNone, PassReason::kUnwatched}) {
        const CallRecord r{ProgramCall{Api::kCudaHostRegister, Via::kSymbol,
                                       reinterpret_cast<void*>(p), SIZE_MAX, 0xffffffffu},
                           -2, t, Action::kHit, INT32_MIN, reason};
        EXPECT_EQ(CallRecordLine(t, INT32_MAX, r).view(),
                  fmt::format(R"({{"type":"call","t_ns":{},"tid":{},"api":"{}","via":"{}","ptr":"{}",)"
                              R"("bytes":{},"flags":{},"result":{},"latency_ns":{},"action":"{}",)"
                              R"("evicted":{}{}}})",
                              t, INT32_MAX, ApiName(r.call.api), ViaName(r.call.via), r.call.ptr,
                              r.call.bytes, r.call.flags, r.result, r.latency_ns,
                              ActionName(r.action), r.evicted,
                              reason == PassReason::kNone ? "" : R"(,"reason":"unwatched")"));
      }
      for (bool forced : {false, true}) {
        ReleaseWait wait;
        wait.waited_ns = t;
        wait.forced = forced;
        EXPECT_EQ(EvictRecordLine(t, 7, p, 4096, EvictReason::kFree, -1, t, wait).view(),
                  fmt::format(R"({{"type":"evict","t_ns":{},"tid":{},"ptr":"{}","bytes":{},)"
                              R"("reason":"{}","result":{},"latency_ns":{},"waited_ns":{}{}}})",
                              t, 7, reinterpret_cast<void*>(p), 4096,
                              EvictReasonName(EvictReason::kFree), -1, t, t,
                              forced ? R"(,"forced":true)" : ""));
      }
    }
  }
}

}  // namespace
}  // namespace lazypin
