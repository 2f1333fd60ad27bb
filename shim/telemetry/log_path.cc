// log_path: the log's name and its safe creation (see log_path.h).
#include "log_path.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstring>

#include "descriptors.h"
#include "fmt/format.h"
#include "json.h"
#include "seccomp.h"

#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#else
struct open_how {
  uint64_t flags;
  uint64_t mode;
  uint64_t resolve;
};
#define RESOLVE_NO_SYMLINKS 0x04
#endif
#ifndef SYS_openat2
#define SYS_openat2 437  // the same number on every architecture
#endif


namespace lazypin {

std::string LogNamePart(std::string_view text) {
  if (text.empty()) return "unknown";
  std::string out(text);
  for (char& c : out) {
    const bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
    if (!keep) c = '_';
  }
  return out;
}

std::string ShortHostName() {
  struct utsname names;
  if (uname(&names) != 0) return LogNamePart({});
  const std::string_view node(names.nodename);
  return LogNamePart(node.substr(0, node.find('.')));
}


namespace {

// A path as shown in a message: a JSON string of at most its first 80 bytes.
std::string Shown(std::string_view path) {
  constexpr size_t kMax = 80;
  if (path.size() <= kMax) return JsonString(path);
  std::string out = JsonString(path.substr(0, kMax));
  out.insert(out.size() - 1, "...");
  return out;
}

const char* FileKind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a plain file";
}

constexpr const char* kAccepts =
    "LAZYPIN_LOG accepts the path of a new file in a writable directory, without symbolic links";

// The message for a path refused because `link` (a prefix of it) is a link,
// with the same path without links as a suggestion where there is one.
std::string LinkMessage(std::string_view path, std::string_view link, std::string_view dir,
                        std::string_view name) {
  std::string suggestion;
  char resolved[PATH_MAX];
  if (realpath(std::string(dir).c_str(), resolved) != nullptr) {
    std::string candidate = std::string(resolved) + (resolved[1] == '\0' ? "" : "/") + std::string(name);
    struct stat st;
    if (lstat(candidate.c_str(), &st) != 0 || S_ISREG(st.st_mode)) {
      suggestion = fmt::format(", such as {}", Shown(candidate));
    }
  }
  return fmt::format("lazypin: LAZYPIN_LOG={} goes through a symbolic link ({}); lazypin follows "
                     "no link in a log path, so is not writing a log file ({}{})",
                     Shown(path), Shown(link), kAccepts, suggestion);
}

// openat2(2) of a directory, no link followed (magic links included); -1
// with errno ENOSYS on kernels before 5.6.
long OpenAt2NoSymlinks(const char* dir) {
  struct open_how how;
  memset(&how, 0, sizeof(how));
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS;
  return syscall(SYS_openat2, AT_FDCWD, dir, &how, sizeof(how));
}

// The directory part of `path` ("" for the current directory) as an O_PATH
// descriptor (AT_FDCWD for ""), every component checked not to be a link; or
// -1 and `*message` set.
int OpenDirectory(const std::string& path, std::string_view dir, std::string_view name,
                  LogPathResolver resolver, std::string* message) {
  if (dir.empty()) return AT_FDCWD;
  if (resolver == LogPathResolver::kAuto && !SeccompFiltered()) {  // openat2 may be forbidden
    const long fd = OpenAt2NoSymlinks(std::string(dir).c_str());
    if (fd >= 0) return static_cast<int>(fd);
    // Any failure (no openat2, seccomp's EPERM, a link, a missing directory):
    // the walk gives the answer and names the component at fault.
  }
  int cur = AT_FDCWD;
  size_t pos = 0;
  if (dir[0] == '/') {
    cur = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cur < 0) {
      *message = fmt::format("lazypin: LAZYPIN_LOG={}: cannot open /: {}; not writing a log file",
                             Shown(path), strerror(errno));
      return -1;
    }
  }
  while (pos < dir.size()) {
    size_t stop = dir.find('/', pos);
    if (stop == std::string_view::npos) stop = dir.size();
    const std::string component(dir.substr(pos, stop - pos));
    pos = stop + 1;
    if (component.empty() || component == ".") continue;
    const int next = ::openat(cur, component.c_str(), O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
    const int err = errno;
    if (next < 0) {
      struct stat st;
      const std::string_view prefix = dir.substr(0, stop);
      if ((err == ENOTDIR || err == ELOOP) &&
          fstatat(cur, component.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        *message = LinkMessage(path, prefix, dir, name);
      } else {
        *message = fmt::format("lazypin: LAZYPIN_LOG={}: cannot use directory {}: {}; not "
                               "writing a log file ({})",
                               Shown(path), Shown(prefix), strerror(err), kAccepts);
      }
      if (cur != AT_FDCWD) ::close(cur);
      return -1;
    }
    if (cur != AT_FDCWD) ::close(cur);
    cur = next;
  }
  return cur;
}

// `name` with ".<n>" before its extension ("same.jsonl" -> "same.1.jsonl"),
// or after it when it has none ("log" -> "log.1", ".log" -> ".log.1").
std::string Suffixed(std::string_view name, int n) {
  const size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return fmt::format("{}.{}", name, n);
  return fmt::format("{}.{}{}", name.substr(0, dot), n, name.substr(dot));
}

// `path` split into its directory part ("" for none) and its name.
struct LogPathParts {
  std::string_view dir;
  std::string name;
};
LogPathParts SplitLogPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {std::string_view(), path};
  return {std::string_view(path).substr(0, slash == 0 ? 1 : slash), path.substr(slash + 1)};
}

std::string NamesADirectoryMessage(const std::string& path) {
  return fmt::format("lazypin: LAZYPIN_LOG={} names a directory, not a file; not writing a log "
                     "file ({})", Shown(path), kAccepts);
}

// The message for a name that exists and is not a regular file (`st`).
std::string NotAFileMessage(const struct stat& st, const std::string& path, std::string_view dir,
                            std::string_view name) {
  if (S_ISLNK(st.st_mode)) return LinkMessage(path, path, dir.empty() ? "." : dir, name);
  return fmt::format("lazypin: LAZYPIN_LOG={} is {}, not a regular file; not writing a log file "
                     "({})", Shown(path), FileKind(st.st_mode), kAccepts);
}

}  // namespace

std::string CheckLogPath(const std::string& path, LogPathResolver resolver) {
  const LogPathParts parts = SplitLogPath(path);
  const std::string& name = parts.name;
  if (name.empty() || name == "." || name == "..") return NamesADirectoryMessage(path);
  std::string message;
  const int dirfd = OpenDirectory(path, parts.dir, name, resolver, &message);
  if (dirfd == -1) return message;
  struct stat st;
  int err = 0;
  if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (!S_ISREG(st.st_mode)) message = NotAFileMessage(st, path, parts.dir, name);
  } else if (errno != ENOENT) {
    err = errno;  // ENAMETOOLONG, say
  }
  if (message.empty() && err == 0) {
    // An unnamed file in the directory (gone at close) is a create the
    // filesystem itself answers (EROFS, EACCES, EDQUOT...); where it has no
    // O_TMPFILE, the permission check is what is left.
    const int probe = ::openat(dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
    if (probe >= 0) {
      ::close(probe);
    } else if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
      err = errno;
    } else if (faccessat(dirfd, ".", W_OK, AT_EACCESS) != 0) {
      err = errno;
    }
  }
  if (err != 0) {
    message = fmt::format("lazypin: LAZYPIN_LOG={}: cannot create the file: {}; not writing a log "
                          "file ({})", Shown(path), strerror(err), kAccepts);
  }
  if (dirfd != AT_FDCWD) ::close(dirfd);
  return message;
}

CreatedLogFile CreateLogFile(const std::string& path, LogPathResolver resolver) {
  CreatedLogFile out;
  const size_t slash = path.rfind('/');
  const LogPathParts parts = SplitLogPath(path);
  const std::string_view dir = parts.dir;
  const std::string& name = parts.name;
  if (name.empty() || name == "." || name == "..") {
    out.message = NamesADirectoryMessage(path);
    return out;
  }
  const int dirfd = OpenDirectory(path, dir, name, resolver, &out.message);
  if (dirfd == -1) return out;
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  constexpr int kMaxSuffix = 1000;
  std::string used = name;
  int fd = ::openat(dirfd, used.c_str(), kFlags, 0600);
  int err = errno;
  if (fd < 0 && err == EEXIST) {
    struct stat st;
    if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
      out.message = NotAFileMessage(st, path, dir, name);
      if (dirfd != AT_FDCWD) ::close(dirfd);
      return out;
    }
    // A regular file (another process's log, or the user's): never touched.
    for (int n = 1; fd < 0 && err == EEXIST && n <= kMaxSuffix; ++n) {
      used = Suffixed(name, n);
      fd = ::openat(dirfd, used.c_str(), kFlags, 0600);
      err = errno;
    }
  }
  if (dirfd != AT_FDCWD) ::close(dirfd);
  const std::string used_path = path.substr(0, slash == std::string::npos ? 0 : slash + 1) + used;
  if (fd < 0) {
    out.message = fmt::format("lazypin: LAZYPIN_LOG={}: cannot create {}: {}; not writing a log "
                              "file ({})", Shown(path), used == name ? "the file" : Shown(used_path),
                              strerror(err), kAccepts);
    return out;
  }
  struct stat st;
  const int flags = fcntl(fd, F_GETFL);
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || flags < 0 ||
      fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    ::close(fd);  // cannot happen for a file this call created; refused all the same
    out.message = fmt::format("lazypin: LAZYPIN_LOG={} did not give a regular file; not writing "
                              "a log file", Shown(used_path));
    return out;
  }
  out.fd = MoveFdHigh(fd);  // out of the program's way (descriptors.h)
  out.dev = st.st_dev;
  out.ino = st.st_ino;
  out.path = used_path;
  if (used != name) {
    out.message = fmt::format("lazypin: LAZYPIN_LOG={} exists (lazypin never overwrites a file); "
                              "this process logs to {}", Shown(path), Shown(used_path));
  }
  return out;
}

std::string ExpandLogPattern(std::string_view pattern, const LogNameFields& fields,
                             void (*literal)(char c, std::string* out)) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '%' && i + 1 < pattern.size()) {
      const char what = pattern[i + 1];
      const std::string* field = what == 'p'   ? &fields.pid
                                 : what == 'h' ? &fields.host
                                 : what == 'e' ? &fields.program
                                               : nullptr;
      if (field != nullptr || what == '%') ++i;
      if (field != nullptr) {
        out += *field;
        continue;
      }
    }
    if (literal != nullptr) literal(c, &out);
    else out.push_back(c);
  }
  return out;
}

std::string ExpandLogPath(std::string_view pattern, int pid) {
  return ExpandLogPattern(pattern, {std::to_string(pid), ShortHostName(),
                                    LogNamePart(program_invocation_short_name)});
}

std::string LogPathGlob(std::string_view pattern, int pid) {
  return ExpandLogPattern(
      pattern, {pid == 0 ? "*" : std::to_string(pid), ShortHostName(), "*"},
      [](char c, std::string* out) {
        if (c == '*' || c == '?' || c == '[') *out += fmt::format("[{}]", c);
        else out->push_back(c);
      });
}

}  // namespace lazypin
