// callsite: native stacks, interned (see callsite.h).
#include "callsite.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>
#include <unwind.h>

#include <algorithm>

#include "fmt/format.h"
#include "json.h"
#include "pyframe.h"

namespace lazypin {
namespace {

struct Unwinding {
  uintptr_t* frames;
  size_t capacity;
  size_t count;
  uintptr_t skip_lo, skip_hi;
};

_Unwind_Reason_Code OnFrame(struct _Unwind_Context* context, void* arg) {
  auto* u = static_cast<Unwinding*>(arg);
  const uintptr_t pc = _Unwind_GetIP(context);
  if (pc == 0) return _URC_END_OF_STACK;
  if (pc >= u->skip_lo && pc < u->skip_hi) return _URC_NO_REASON;
  u->frames[u->count++] = pc;
  return u->count == u->capacity ? _URC_END_OF_STACK : _URC_NO_REASON;
}

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

// PrepareEarly's scan, for the first CallSites.
struct EarlyScan {
  std::mutex mu;
  bool done = false;
  std::vector<std::pair<uintptr_t, uintptr_t>> objects;
  std::string list;  // the `objects` record's list
};
EarlyScan& Early() {
  static EarlyScan* scan = new EarlyScan;  // never destroyed
  return *scan;
}

// One loaded object as the `objects` record lists it.
void AppendObject(std::string* list, const dl_phdr_info* info, uintptr_t hi) {
  const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  const std::string path = *name != '\0' ? std::string(name) : ExecutablePath();
  fmt::format_to(std::back_inserter(*list), R"({}{{"path":{},"base":"{:#x}","size":{}}})",
                 list->empty() ? "" : ",", JsonString(path), info->dlpi_addr, hi - info->dlpi_addr);
}

}  // namespace

void CallSites::PrepareEarly() {
  EarlyScan& early = Early();
  std::lock_guard<std::mutex> lock(early.mu);
  if (early.done) return;
  early.done = true;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        auto* e = static_cast<EarlyScan*>(arg);
        const auto [lo, hi] = Segments(info);
        if (hi == 0) return 0;
        for (const auto& o : e->objects) {
          if (lo >= o.first && lo < o.second) return 0;
        }
        e->objects.push_back({lo, hi});
        AppendObject(&e->list, info, hi);
        return 0;
      },
      &early);
  uintptr_t frames[kMaxFrames];
  CaptureFrames(frames, kMaxFrames, 0, 0);  // the unwinder's first use, here
}

size_t CaptureFrames(uintptr_t* frames, size_t capacity, uintptr_t skip_lo, uintptr_t skip_hi) {
  if (capacity == 0) return 0;
  Unwinding u{frames, capacity, 0, skip_lo, skip_hi};
  _Unwind_Backtrace(&OnFrame, &u);
  return u.count;
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
  std::pair<uintptr_t, uintptr_t> own;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!own_known_ && own_code_ != nullptr) own_ = ObjectRange(own_code_);
    own_known_ = true;
    own = own_;
  }
  uintptr_t frames[kMaxFrames];
  const size_t count = CaptureFrames(frames, kMaxFrames, own.first, own.second);
  return Intern(frames, count, PythonFrame(), emit);
}

int CallSites::CaptureOnce(uint64_t key, Emit emit) {
  if (key != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!keys_tried_) {
      keys_tried_ = true;
      void* p = mmap(nullptr, sizeof(KeySlot) * kKeys, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p != MAP_FAILED) keys_ = static_cast<KeySlot*>(p);
    }
    if (keys_ != nullptr) {  // else every call captures (below, without the lock)
      const KeySlot& slot = keys_[(key * 0x9e3779b97f4a7c15u) >> 52];
      if (slot.key == key && slot.id != 0) return slot.id;
    }
  }
  const int id = Capture(emit);
  if (key != 0 && id != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (keys_ != nullptr) keys_[(key * 0x9e3779b97f4a7c15u) >> 52] = KeySlot{key, id};
  }
  return id;
}

int CallSites::Intern(const uintptr_t* frames, size_t count, std::string_view python, Emit emit) {
  if (count == 0) return 0;
  count = std::min(count, kMaxFrames);
  uint64_t hash = HashFrames(frames, count);
  for (char c : python) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3u;
  std::lock_guard<std::mutex> lock(mu_);
  if (!slots_tried_) {
    slots_tried_ = true;
    void* p = mmap(nullptr, sizeof(Slot) * kSlots, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) slots_ = static_cast<Slot*>(p);
  }
  if (slots_ == nullptr) return 0;
  if (!adopted_) {  // PrepareEarly's scan: those objects are known, their record comes first
    adopted_ = true;
    EarlyScan& early = Early();
    std::lock_guard<std::mutex> early_lock(early.mu);
    for (const auto& [lo, hi] : early.objects) objects_.push_back({lo, hi});
    if (!early.list.empty()) early_line_ = R"({"type":"objects","list":[)" + early.list + "]}";
  }
  for (size_t probe = 0; probe < kSlots; ++probe) {
    Slot& slot = slots_[(hash + probe) & (kSlots - 1)];
    if (slot.count == 0) {
      if (used_ * 4 >= kSlots * 3) return 0;  // full enough: probes stay short
      slot.hash = hash;
      slot.count = static_cast<uint32_t>(count);
      std::copy(frames, frames + count, slot.frames);
      slot.id = static_cast<int>(++used_);
      if (!early_line_.empty()) {  // the early scan's objects, before the first stack
        emit(early_line_);
        std::string().swap(early_line_);
      }
      slot.python = python.empty() ? nullptr : new std::string(python);
      bool all_known = true;
      for (size_t i = 0; i < count && all_known; ++i) all_known = Known(frames[i]);
      if (!all_known) {
        const std::string objects = NewObjectsLine();
        if (!objects.empty()) emit(objects);
      }
      std::string line = fmt::format(R"({{"type":"stack","id":{},"frames":[)", slot.id);
      for (size_t i = 0; i < count; ++i) {
        fmt::format_to(std::back_inserter(line), R"({}"{:#x}")", i == 0 ? "" : ",", frames[i]);
      }
      line += "]";
      if (!python.empty()) line += R"(,"python":)" + JsonString(python);
      line += "}";
      emit(line);
      return slot.id;
    }
    if (slot.hash == hash && slot.count == count &&
        (slot.python != nullptr ? std::string_view(*slot.python) : std::string_view()) == python &&
        std::equal(frames, frames + count, slot.frames)) {
      return slot.id;
    }
  }
  return 0;
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
