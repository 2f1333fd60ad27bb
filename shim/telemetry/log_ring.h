// log_ring: the bounded queue between the threads that make log records and
// the log's one writer thread. Many producers, one consumer, lock-free
// (D. Vyukov's bounded queue: a sequence number per slot): a push is one
// compare-and-swap and two cache lines, never a system call, never an
// allocation, async-signal-safe. A full ring refuses the push (the caller
// decides: Log waits briefly, then counts a drop).
//
// The slots live in a zeroed anonymous mapping, touched only as they are
// used: each slot stores its sequence number minus its index, so that zero is
// the initial state and nothing is written when the ring is made.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "log_entry.h"
#include "pages.h"
#include "prefault.h"

namespace lazypin {

class LogRing {
 public:
  static constexpr uint64_t kSlots = 8192;  // a power of two; 512 KiB of slots
  static constexpr size_t kFirstPagesBytes = 16384;

  LogRing() {
    void* p = mmap(nullptr, sizeof(Slot) * kSlots, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    slots_ = p == MAP_FAILED ? nullptr : static_cast<Slot*>(p);
    // The first records (a call's stack and objects lines, its record) take
    // no page fault in the program's first call; Prefault does the rest.
    if (slots_ != nullptr) PopulateWrite(slots_, kFirstPagesBytes);
  }
  LogRing(const LogRing&) = delete;
  LogRing& operator=(const LogRing&) = delete;
  // Never unmapped: a producer may still hold a slot at exit.

  bool ok() const { return slots_ != nullptr; }

  // Faults the slots' pages in (contents unchanged; safe while producers
  // push), so that no push takes a page fault. For the writer thread.
  void Prefault() {
    if (slots_ == nullptr) return;
    if (PopulateWrite(slots_, sizeof(Slot) * kSlots)) return;
    for (uint64_t i = 0; i < kSlots; i += 4096 / sizeof(Slot)) {
      slots_[i].seq.fetch_add(0, std::memory_order_relaxed);
    }
  }

  // Any thread: the record's position plus one, or 0 when the ring is full
  // (or could not be made).
  uint64_t TryPush(const LogEntry& entry) {
    if (slots_ == nullptr) return 0;
    uint64_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      Slot& slot = slots_[pos & (kSlots - 1)];
      const uint64_t seq = slot.seq.load(std::memory_order_acquire) + (pos & (kSlots - 1));
      const int64_t dif = static_cast<int64_t>(seq - pos);
      if (dif == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          memcpy(static_cast<void*>(&slot.entry), &entry, sizeof entry);
          slot.seq.store(pos + 1 - (pos & (kSlots - 1)), std::memory_order_release);
          return pos + 1;
        }
      } else if (dif < 0) {
        return 0;  // full: the slot still holds the record of one lap ago
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

  // The one consumer: false when the next record is not there (yet).
  bool Pop(LogEntry* out) {
    if (slots_ == nullptr) return false;
    const uint64_t pos = tail_.load(std::memory_order_relaxed);
    Slot& slot = slots_[pos & (kSlots - 1)];
    const uint64_t seq = slot.seq.load(std::memory_order_acquire) + (pos & (kSlots - 1));
    if (static_cast<int64_t>(seq - (pos + 1)) < 0) return false;
    memcpy(static_cast<void*>(out), &slot.entry, sizeof *out);
    slot.seq.store(pos + kSlots - (pos & (kSlots - 1)), std::memory_order_release);
    tail_.store(pos + 1, std::memory_order_release);
    return true;
  }

  // Records pushed so far (claimed: a producer may still be copying one in),
  // and records popped so far.
  uint64_t pushed() const { return head_.load(std::memory_order_acquire); }
  uint64_t popped() const { return tail_.load(std::memory_order_acquire); }

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> seq;  // sequence number minus the slot's index
    LogEntry entry;
  };
  static_assert(sizeof(Slot) == 64, "a slot is one cache line");
  Slot* slots_ = nullptr;
  alignas(64) std::atomic<uint64_t> head_{0};  // next position to claim
  alignas(64) std::atomic<uint64_t> tail_{0};  // next position to pop
};

}  // namespace lazypin
