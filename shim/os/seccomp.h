// seccomp: whether lazypin may make system calls the program itself may never
// make. Under a seccomp filter (systemd's SystemCallFilter=, container
// profiles, sandboxes) a call the filter does not allow can kill the whole
// process (SIGSYS), so where a filter may be in force lazypin makes none of
// its optional calls (userfaultfd, set_mempolicy, get_mempolicy,
// MADV_POPULATE_WRITE, MADV_WIPEONFORK, openat2) and takes the fallback that
// each already has. Only calls every CUDA program makes stay (open, read,
// write, close, mmap, ioctl, futex, poll, clone).
//
// Filters are per thread and can be added at any time, never removed: the
// answer is read from /proc/thread-self/status ("Seccomp:") of the calling
// thread, and once a filter has been seen on any thread it is taken as in
// force everywhere, from then on. Unreadable status counts as a filter.
#pragma once

#include <string>

namespace lazypin {

// Whether a seccomp filter (or strict mode) may be in force on the calling
// thread. Reads /proc/thread-self/status (about 10-20 us) until a filter is
// seen, then answers true with one relaxed load.
bool SeccompFiltered();

// SeccompFiltered() as last seen, without reading anything (one relaxed load):
// for calls made at set-up, right after a SeccompFiltered() there.
bool SeccompFilterSeen();

// The first caller after a filter was seen gets true (and says so once, in
// its own way); every other caller gets false.
bool TakeSeccompNotice();

// "Seccomp: 2, Seccomp_filters: 1" as the calling thread's status says, for messages.
std::string SeccompStatusText();

}  // namespace lazypin
