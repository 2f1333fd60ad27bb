// page_class: what kind of pages back a range, judged at the real register.
// Only private anonymous memory (heap, stacks, anonymous mmap, a library's
// .bss beyond its file) changes solely through calls of this process that
// the hooks and the kernel watch see. Shared memory (MAP_SHARED anything,
// memfd, /dev/shm and tmpfs files, SysV shm) and every file mapping, private
// ones too (truncating the file zaps their copied-on-write pages as well),
// can have their pages replaced by another process or by fallocate/ftruncate
// with no event: such ranges are not deferrable.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"

namespace lazypin {

enum class PageClass {
  kPrivateAnonymous,  // every page: private and backed by no file
  kShared,            // some VMA is shared (MAP_SHARED, shmem, SysV shm)
  kFileBacked,        // some VMA maps a file privately
  kUnmapped,          // some page is in no mapping
  kUnknown,           // /proc/self/maps could not be read
};
const char* PageClassName(PageClass page_class);
inline bool Deferrable(PageClass page_class) { return page_class == PageClass::kPrivateAnonymous; }

// One mapping of /proc/self/maps.
struct Mapping {
  uintptr_t lo, hi;
  bool shared;    // VM_MAYSHARE ('s' in the permissions)
  bool has_file;  // backed by a file (an inode), shmem included
  bool readable;  // PROT_READ ('r')
  bool writable;  // PROT_WRITE ('w')
};

enum class MapsMethod {
  kAuto,          // PROCMAP_QUERY where the kernel has it (6.11+), else parsing
  kProcmapQuery,  // the ioctl only (false from ForEachMapping where absent)
  kParse,         // /proc/self/maps text, read in fixed stack buffers
};

// Calls visit() for each mapping overlapping [lo, hi), in address order,
// until it returns false. Allocates nothing. False if the maps could not be
// read (or the method is unavailable).
bool ForEachMapping(uintptr_t lo, uintptr_t hi, absl::FunctionRef<bool(const Mapping&)> visit,
                    MapsMethod method = MapsMethod::kAuto);

// The class of the pages of [lo, hi) (rounded to pages): the worst of the
// VMAs it spans (unmapped > shared > file-backed > private anonymous).
PageClass ClassifyRange(uintptr_t lo, uintptr_t hi, MapsMethod method = MapsMethod::kAuto);

// Whether this kernel answers PROCMAP_QUERY.
bool HaveProcmapQuery();

}  // namespace lazypin
