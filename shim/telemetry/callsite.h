// callsite: which code made a call. The calling thread's native stack, taken
// by a walk that never faults (unwind.h: the loaded objects' unwind tables,
// found through the loader's _dl_find_object, no lock, no allocation; the
// stack read only inside its own readable mapping), lazypin's own frames left out,
// and interned: each unique stack gets an id, and its frames and any object
// not yet named are written once to the log, before the first record that
// names the id (docs/log-format.md, "objects and stack"). Symbols are the
// report's business: the shim writes addresses only. In a Python program the
// innermost Python line, where it may be read (pyframe.h), is part of the
// stack: the same native frames from two Python lines are two stacks.
//
// Thread-safe; the table is taken with a mutex, which is fine on the paths
// that use it (driver calls of hundreds of microseconds). Not for signal handlers.
#pragma once

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"

namespace lazypin {

// The return addresses of the calling thread's stack, innermost first,
// without the frames inside [skip_lo, skip_hi) (lazypin's own code); at most
// `capacity`. Returns how many.
size_t CaptureFrames(uintptr_t* frames, size_t capacity, uintptr_t skip_lo, uintptr_t skip_hi);

class CallSites {
 public:
  static constexpr size_t kMaxFrames = 16;  // outside lazypin; the report shows 4
  static constexpr size_t kSlots = 4096;  // the index's size; 3/4 of it: unique stacks kept

  // Frames inside the object that holds `own_code` (lazypin's) are left out;
  // null: none are. Does here what the first Capture would otherwise do
  // inside the program's call: looks up that object, maps the tables, scans
  // the loaded objects (their `objects` record goes before the first stack),
  // unwinds once (the unwinder's first use) and resolves the Python API.
  explicit CallSites(const void* own_code);
  CallSites(const CallSites&) = delete;
  CallSites& operator=(const CallSites&) = delete;

  // Takes the calling thread's stack and returns its id (1, 2, ...), or 0
  // for none (no frame outside lazypin, or the table is full). `emit` gets,
  // in order, what must precede the first record naming a new id: the line
  // of an `objects` record for objects not yet written (rare: made here),
  // then the new id, whose `stack` record is StackLine(id): formatted later,
  // on any thread (the log's writer), not in the program's call. Called
  // with the table locked: `emit` may call StackLine, nothing else here.
  struct Emit {
    absl::FunctionRef<void(std::string&& line)> objects;
    absl::FunctionRef<void(int id)> stack;
  };
  int Capture(Emit emit);

  // The `stack` record of an id that Capture, CaptureOnce or Intern returned.
  // Takes no lock (the log's writer calls it while callers hold the table's).
  std::string StackLine(int id) const;


  // Capture() once per `key` (the recorder's: a call's API with its caller,
  // or with its address and size): a later call with the same key gets the
  // id its first one got, without unwinding (about 100-250 ns a frame). A
  // key's slot taken by another key captures again. `key` 0: always captures.
  int CaptureOnce(uint64_t key, Emit emit);

  // The same with frames (and a Python line, "" for none) the caller took.
  int Intern(const uintptr_t* frames, size_t count, std::string_view python, Emit emit);

  // How many times a stack was walked (Capture, also inside CaptureOnce),
  // and how many unique stacks have an id. Any thread, relaxed.
  uint64_t unwound() const { return unwound_.load(std::memory_order_relaxed); }
  size_t unique() const { return used_.load(std::memory_order_relaxed); }

  // The address range of the object that holds `address` (lazypin's own,
  // for the constructor); {0, 0} when none.
  static std::pair<uintptr_t, uintptr_t> ObjectRange(const void* address);

 private:
  struct Object {
    uintptr_t lo, hi;  // [lo, hi): its loaded segments
  };
  struct Stack {  // an interned stack; its id is its index + 1
    uint64_t hash;
    uint32_t count;
    const std::string* python;  // null: none (never freed: at most kStacks)
    uintptr_t frames[kMaxFrames];
  };
  static constexpr size_t kStacks = kSlots / 4 * 3;  // the index stays a quarter empty: short probes
  static_assert(kStacks <= 32767, "a log entry holds a stack's id in 16 bits");
  bool Known(uintptr_t pc) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Scans the loaded objects; returns the `objects` line for those not yet written ("" if none).
  std::string NewObjectsLine() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static constexpr size_t kKeys = 4096;
  struct KeySlot {
    uint64_t key = 0;
    int id = 0;
  };

  std::mutex mu_;
  std::pair<uintptr_t, uintptr_t> own_ = {0, 0};  // lazypin's object; set by the constructor
  // kKeys, a zeroed anonymous mapping; null: the mapping failed, every call captures.
  KeySlot* keys_ ABSL_GUARDED_BY(mu_) = nullptr;
  // One zeroed anonymous mapping, never unmapped: the index (kSlots ids by
  // hash, open addressing; 0: empty), then kStacks stacks in id order. The
  // constructor faults in the index and the first stacks, the rest fault in
  // as stacks are added. Null: the mapping failed, no stack gets an id.
  uint32_t* index_ ABSL_GUARDED_BY(mu_) = nullptr;
  Stack* stacks_ = nullptr;  // set by the constructor; a stack never changes once counted in used_
  std::atomic<size_t> used_{0};  // stacks added (written under mu_, read by StackLine without it)
  std::atomic<uint64_t> unwound_{0};
  std::vector<Object> objects_ ABSL_GUARDED_BY(mu_);
  // The constructor's scan as an `objects` record, until the first stack emits it.
  std::string first_objects_line_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazypin
