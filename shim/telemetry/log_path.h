// log_path: the log's name and its safe creation: the name's pattern
// (LAZYPIN_LOG's %p, %h, %e), and a new file made without following a link,
// opening anything that exists, or blocking (docs/reliability.md).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace lazypin {

// `text` as a part of a file name: each byte outside [A-Za-z0-9._-] becomes
// '_' (so no '/', no '%', no space); "unknown" when `text` is empty.
std::string LogNamePart(std::string_view text);

// This machine's short host name: uname(2)'s nodename up to its first dot,
// as a LogNamePart ("unknown" when that is empty). What %h expands to.
std::string ShortHostName();

// What a log path pattern (LAZYPIN_LOG) names: %p the process id, %h the
// host (ShortHostName), %e the program (its short invocation name, as a
// LogNamePart), %% a literal %; any other %, and a trailing one, stay as they
// are. ExpandLogPattern is the one expansion: the shim's (ExpandLogPath) and
// lazypin run's (the lazypin-options tool: the glob of a run's logs, the name
// it announces) are made from it.
struct LogNameFields {
  std::string pid;
  std::string host;
  std::string program;
};
// `literal`, when given, writes each byte of the pattern that is not a field
// (escaping a glob's wildcards, say).
std::string ExpandLogPattern(std::string_view pattern, const LogNameFields& fields,
                             void (*literal)(char c, std::string* out) = nullptr);
// This process's log path: the fields of process `pid` on this host, this program.
std::string ExpandLogPath(std::string_view pattern, int pid);
// A shell glob (Python's glob, fnmatch) that matches every path ExpandLogPath
// can make from `pattern` on this host: %p and %e any text (%p the given
// `pid` when it is not 0), the pattern's own wildcards escaped.
std::string LogPathGlob(std::string_view pattern, int pid = 0);

// How CreateLogFile resolves the directory part of a path: kAuto uses
// openat2(RESOLVE_NO_SYMLINKS) where the kernel has it and the walk otherwise;
// kWalk always walks (one openat(O_PATH|O_NOFOLLOW|O_DIRECTORY) per component).
enum class LogPathResolver { kAuto, kWalk };

// The file-creating part of Log::Open. `fd` is the new file (or -1), `path`
// the name it was created under, `message` one line for stderr (no newline):
// why nothing was created, or, when the requested name was taken, where the
// log went; empty otherwise. The policy (docs/reliability.md):
//  - No component of `path` may be a symbolic link (magic links in /proc
//    included); a relative path is resolved from the current directory, whose
//    own path is not examined.
//  - Every log is an exclusive create, mode 0600: an existing file (a log of
//    another process, a user's file, a hard link to one) is never opened,
//    truncated or written. When the name is a regular file, the log is
//    created as <stem>.1.<ext>, <stem>.2.<ext>, ... (at most 1000 tries);
//    when it is anything else (a FIFO, a socket, a device, a directory, a
//    link), no log is written.
//  - No call can block: the create is O_NONBLOCK (cleared afterwards).
struct CreatedLogFile {
  int fd = -1;
  dev_t dev = 0;  // the file's identity, read at its creation: a thread that
  ino_t ino = 0;  // takes `fd` later checks it still names this file
  std::string path;
  std::string message;
};
CreatedLogFile CreateLogFile(const std::string& path,
                             LogPathResolver resolver = LogPathResolver::kAuto);
// What CreateLogFile would say about `path` without leaving anything behind:
// empty when a log could be created there (at `path` or a suffixed name),
// else the one line why not (CreateLogFile's message): a missing directory, a
// link in the way, something not a regular file at the name, a directory in
// which the filesystem refuses a new file (an unnamed O_TMPFILE probe where
// the filesystem has it: EACCES, EROFS, EDQUOT; else the permission bits).
// For `lazypin run`, before it starts a program.
std::string CheckLogPath(const std::string& path,
                         LogPathResolver resolver = LogPathResolver::kAuto);

}  // namespace lazypin
