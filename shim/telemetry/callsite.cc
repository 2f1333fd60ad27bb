// callsite: native stacks, interned (see callsite.h).
#include "callsite.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "fmt/format.h"
#include "json.h"
#include "pages.h"
#include "prefault.h"
#include "pyframe.h"
#include "unwind.h"

namespace lazypin {
namespace {

uint64_t HashFrames(const uintptr_t* frames, size_t count) {
  uint64_t h = 0x9e3779b97f4a7c15u ^ count;
  for (size_t i = 0; i < count; ++i) {
    h ^= frames[i];
    h *= 0xff51afd7ed558ccdu;
    h ^= h >> 32;
  }
  return h == 0 ? 1 : h;
}

// [lo, hi) of one loaded object's PT_LOAD segments.
std::pair<uintptr_t, uintptr_t> Segments(const dl_phdr_info* info) {
  uintptr_t lo = ~uintptr_t{0}, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    lo = std::min<uintptr_t>(lo, info->dlpi_addr + ph.p_vaddr);
    hi = std::max<uintptr_t>(hi, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
  }
  return hi == 0 ? std::pair<uintptr_t, uintptr_t>{0, 0} : std::pair{lo, hi};
}

std::string ExecutablePath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// One loaded object as the `objects` record lists it.
void AppendObject(std::string* list, const dl_phdr_info* info, uintptr_t hi) {
  const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  const std::string path = *name != '\0' ? std::string(name) : ExecutablePath();
  fmt::format_to(std::back_inserter(*list), R"({}{{"path":{},"base":"{:#x}","size":{}}})",
                 list->empty() ? "" : ",", JsonString(path), info->dlpi_addr, hi - info->dlpi_addr);
}

}  // namespace

CallSites::CallSites(const void* own_code) {
  if (own_code != nullptr) own_ = ObjectRange(own_code);
  std::lock_guard<std::mutex> lock(mu_);
  const size_t keys_bytes = sizeof(KeySlot) * kKeys;
  void* keys = mmap(nullptr, keys_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (keys != MAP_FAILED) {
    keys_ = static_cast<KeySlot*>(keys);
    PopulateWrite(keys, keys_bytes);  // a key lands anywhere in it
  }
  const size_t index_bytes = sizeof(uint32_t) * kSlots;
  void* table = mmap(nullptr, index_bytes + sizeof(Stack) * kStacks, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (table != MAP_FAILED) {
    index_ = static_cast<uint32_t*>(table);
    stacks_ = reinterpret_cast<Stack*>(static_cast<char*>(table) + index_bytes);
    PopulateWrite(table, index_bytes + 2 * 4096);
  }
  first_objects_line_ = NewObjectsLine();
  uintptr_t frames[kMaxFrames];
  CaptureFrames(frames, kMaxFrames, 0, 0);
  PreparePythonFrame();
}

size_t CaptureFrames(uintptr_t* frames, size_t capacity, uintptr_t skip_lo, uintptr_t skip_hi) {
  return SafeBacktrace(frames, capacity, skip_lo, skip_hi);
}

std::pair<uintptr_t, uintptr_t> CallSites::ObjectRange(const void* address) {
  struct Search {
    uintptr_t address;
    std::pair<uintptr_t, uintptr_t> range{0, 0};
  } search{reinterpret_cast<uintptr_t>(address)};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        auto* s = static_cast<Search*>(arg);
        const auto range = Segments(info);
        if (s->address < range.first || s->address >= range.second) return 0;
        s->range = range;
        return 1;
      },
      &search);
  return search.range;
}

int CallSites::Capture(Emit emit) {
  uintptr_t frames[kMaxFrames];
  const size_t count = CaptureFrames(frames, kMaxFrames, own_.first, own_.second);
  unwound_.fetch_add(1, std::memory_order_relaxed);
  return Intern(frames, count, PythonFrame(), emit);
}

int CallSites::CaptureOnce(uint64_t key, Emit emit) {
  // Two slots per key (a pair): two keys that alternate and share a slot,
  // such as a wrapper's two callers, do not evict each other.
  const size_t pair = ((key * 0x9e3779b97f4a7c15u) >> 52) & ~size_t{1};
  if (key != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (keys_ != nullptr) {  // else every call captures (below, without the lock)
      for (size_t i = pair; i < pair + 2; ++i) {
        if (keys_[i].key == key && keys_[i].id != 0) return keys_[i].id;
      }
    }
  }
  const int id = Capture(emit);
  if (key != 0 && id != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (keys_ != nullptr) {
      // The newest key first, the one before it second: of the keys sharing
      // a pair, the two unwound last are kept.
      if (keys_[pair].key != 0 && keys_[pair].key != key) keys_[pair + 1] = keys_[pair];
      keys_[pair] = KeySlot{key, id};
    }
  }
  return id;
}

int CallSites::Intern(const uintptr_t* frames, size_t count, std::string_view python, Emit emit) {
  if (count == 0) return 0;
  count = std::min(count, kMaxFrames);
  uint64_t hash = HashFrames(frames, count);
  for (char c : python) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3u;
  std::lock_guard<std::mutex> lock(mu_);
  if (index_ == nullptr) return 0;
  for (size_t probe = 0; probe < kSlots; ++probe) {
    uint32_t& id = index_[(hash + probe) & (kSlots - 1)];
    if (id == 0) {
      const size_t used = used_.load(std::memory_order_relaxed);
      if (used == kStacks) return 0;
      Stack& stack = stacks_[used];
      stack.hash = hash;
      stack.count = static_cast<uint32_t>(count);
      std::copy(frames, frames + count, stack.frames);
      stack.python = python.empty() ? nullptr : new std::string(python);
      used_.store(used + 1, std::memory_order_release);
      id = static_cast<uint32_t>(used + 1);
      if (!first_objects_line_.empty()) emit.objects(std::exchange(first_objects_line_, {}));
      bool all_known = true;
      for (size_t i = 0; i < count && all_known; ++i) all_known = Known(frames[i]);
      if (!all_known) {
        std::string objects = NewObjectsLine();
        if (!objects.empty()) emit.objects(std::move(objects));
      }
      emit.stack(static_cast<int>(id));
      return static_cast<int>(id);
    }
    const Stack& stack = stacks_[id - 1];
    if (stack.hash == hash && stack.count == count &&
        (stack.python != nullptr ? std::string_view(*stack.python) : std::string_view()) == python &&
        std::equal(frames, frames + count, stack.frames)) {
      return static_cast<int>(id);
    }
  }
  return 0;
}

std::string CallSites::StackLine(int id) const {
  if (id <= 0 || static_cast<size_t>(id) > used_.load(std::memory_order_acquire)) return {};
  const Stack& stack = stacks_[id - 1];
  std::string line = fmt::format(R"({{"type":"stack","id":{},"frames":[)", id);
  for (size_t i = 0; i < stack.count; ++i) {
    fmt::format_to(std::back_inserter(line), R"({}"{:#x}")", i == 0 ? "" : ",", stack.frames[i]);
  }
  line += "]";
  if (stack.python != nullptr) line += R"(,"python":)" + JsonString(*stack.python);
  line += "}";
  return line;
}

bool CallSites::Known(uintptr_t pc) const {
  for (const Object& o : objects_) {
    if (pc >= o.lo && pc < o.hi) return true;
  }
  return false;
}

std::string CallSites::NewObjectsLine() {
  struct Scan {
    CallSites* self;
    std::string list;
  } scan{this, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        auto* s = static_cast<Scan*>(arg);
        const auto [lo, hi] = Segments(info);
        if (hi == 0 || s->self->Known(lo)) return 0;
        s->self->objects_.push_back({lo, hi});
        AppendObject(&s->list, info, hi);
        return 0;
      },
      &scan);
  return scan.list.empty() ? std::string() : R"({"type":"objects","list":[)" + scan.list + "]}";
}

}  // namespace lazypin
