// log_entry: one log record as a calling thread hands it to the log's writer
// thread: fixed size, plain values only (nothing points into the caller's
// memory), so that the caller copies 56 bytes and the writer formats it.
#pragma once

#include <cstdint>
#include <string>

#include "types.h"

namespace lazypin {

struct LogEntry {
  // kStack: a call site's `stack` record (`stack`: its id), formatted by the
  // writer; kDropped: see Log::Formatter.
  enum class Kind : uint8_t { kCall, kEvict, kStack, kText, kDropped };
  Kind kind = Kind::kText;
  uint8_t api = 0;           // kCall: Api
  uint8_t via = 0;           // kCall: Via
  uint8_t action = 0;        // kCall: Action
  uint8_t reason = 0;        // kCall: PassReason; kEvict: EvictReason
  union {
    bool forced;             // kEvict
    int8_t device;           // kCall: the current context's device with several devices, else -1
  };
  int16_t stack = 0;         // kCall, kEvict, kStack: the stack's id (callsite.h), 0 for none
  int32_t result = 0;
  int32_t tid = 0;
  union {
    struct {
      uint32_t flags;        // the call's flags
      int32_t evicted;       // registrations it released
    } call;                  // kCall
    int64_t waited_ns;       // kEvict
  };
  int64_t t_ns = 0;
  int64_t latency_ns = 0;
  union {
    uint64_t ptr;            // kCall, kEvict
    std::string* text;       // kText: the whole line, owned by the entry until the writer takes it
  };
  uint64_t bytes = 0;        // kCall, kEvict; kDropped: records dropped
  LogEntry() : device(-1), waited_ns(0), ptr(0) {}
};
// With the ring's sequence number, one 64-byte cache line a record: a
// caller's record moves one line between its core and the writer's.
static_assert(sizeof(LogEntry) == 56, "a log entry is 56 bytes");

}  // namespace lazypin
