// unwind: a stack walk that never faults (see unwind.h).
#include "unwind.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>
#include <unwind.h>

#include <type_traits>

#include "page_class.h"
#include "seccomp.h"
#include "thread_state.h"

namespace lazypin {

#if defined(__x86_64__)
namespace {

constexpr int kRegs = 17;  // DWARF numbering: 0-15 the general registers, 16 the return address
constexpr int kSp = 7;
constexpr int kRa = 16;
constexpr size_t kMaxSteps = 64;  // frames walked beyond the first `capacity` recorded

// The readable stack bytes [lo, hi): from the stack pointer at the capture to
// the end of its mapping.
struct Window {
  uintptr_t lo = 0, hi = 0;
  bool Read(uintptr_t addr, uintptr_t* out) const {
    if (addr < lo || hi - lo < sizeof(uintptr_t) || addr > hi - sizeof(uintptr_t)) return false;
    memcpy(out, reinterpret_cast<const void*>(addr), sizeof(uintptr_t));
    return true;
  }
};

struct Regs {
  uintptr_t value[kRegs] = {};
  bool known[kRegs] = {};
};

// A cursor over unwind data an object holds (mapped by the loader).
struct Cursor {
  const uint8_t* p;
  const uint8_t* end;
  bool Has(size_t n) const { return p <= end && static_cast<size_t>(end - p) >= n; }
  template <typename T>
  bool Fixed(T* out) {
    if (!Has(sizeof(T))) return false;
    memcpy(out, p, sizeof(T));
    p += sizeof(T);
    return true;
  }
  bool Uleb(uint64_t* out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
      const uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        *out = v;
        return true;
      }
    }
    return false;
  }
  bool Sleb(int64_t* out) {
    uint64_t v = 0;
    int shift = 0;
    while (shift < 64 && p < end) {
      const uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if ((b & 0x80) == 0) {
        if (shift < 64 && (b & 0x40)) v |= ~uint64_t{0} << shift;
        *out = static_cast<int64_t>(v);
        return true;
      }
    }
    return false;
  }
  bool Skip(uint64_t n) {
    if (!Has(n)) return false;
    p += n;
    return true;
  }
  // A DW_EH_PE_* encoded pointer: absolute, pc-relative or relative to
  // `data_base`; never indirect (nothing is dereferenced).
  bool Encoded(uint8_t enc, uintptr_t data_base, uintptr_t* out) {
    if (enc == 0xff) return false;  // omitted
    uintptr_t base = 0;
    switch (enc & 0x70) {
      case 0x00: break;
      case 0x10: base = reinterpret_cast<uintptr_t>(p); break;
      case 0x30: base = data_base; break;
      default: return false;
    }
    uint64_t v = 0;
    switch (enc & 0x0f) {
      case 0x00: case 0x04: { uint64_t x; if (!Fixed(&x)) return false; v = x; break; }
      case 0x01: if (!Uleb(&v)) return false; break;
      case 0x02: { uint16_t x; if (!Fixed(&x)) return false; v = x; break; }
      case 0x03: { uint32_t x; if (!Fixed(&x)) return false; v = x; break; }
      case 0x09: { int64_t x; if (!Sleb(&x)) return false; v = static_cast<uint64_t>(x); break; }
      case 0x0a: { int16_t x; if (!Fixed(&x)) return false; v = static_cast<uint64_t>(int64_t{x}); break; }
      case 0x0b: { int32_t x; if (!Fixed(&x)) return false; v = static_cast<uint64_t>(int64_t{x}); break; }
      case 0x0c: { int64_t x; if (!Fixed(&x)) return false; v = static_cast<uint64_t>(x); break; }
      default: return false;
    }
    *out = base + v;
    return true;
  }
};

enum class How : uint8_t { kSame, kUndefined, kOffset, kValOffset, kRegister, kExpr, kValExpr };
struct Rule {
  How how = How::kSame;
  int64_t n = 0;                   // offset, register, or expression length
  const uint8_t* expr = nullptr;
};
struct Row {
  uint64_t cfa_reg = kSp;
  int64_t cfa_offset = 0;
  const uint8_t* cfa_expr = nullptr;  // DW_CFA_def_cfa_expression: its bytes
  uint64_t cfa_expr_len = 0;
  Rule rules[kRegs];
};

struct Cie {
  uint64_t code_align = 1;
  int64_t data_align = 1;
  uint64_t ra = kRa;
  uint8_t fde_enc = 0;
  bool z = false;       // augmentation data present
  bool signal = false;  // 'S': a signal trampoline's frame
  Cursor insns{nullptr, nullptr};
};

bool ParseCie(const uint8_t* at, Cie* cie) {
  uint32_t length;
  memcpy(&length, at, 4);
  if (length == 0 || length == 0xffffffffu) return false;  // no 64-bit .eh_frame on x86-64
  Cursor c{at + 4, at + 4 + length};
  uint32_t id;
  uint8_t version;
  if (!c.Fixed(&id) || id != 0 || !c.Fixed(&version) || (version != 1 && version != 3)) return false;
  const char* aug = reinterpret_cast<const char*>(c.p);
  const size_t aug_len = strnlen(aug, static_cast<size_t>(c.end - c.p));
  if (!c.Skip(aug_len + 1)) return false;
  if (!c.Uleb(&cie->code_align) || !c.Sleb(&cie->data_align)) return false;
  if (version == 1) {
    uint8_t ra;
    if (!c.Fixed(&ra)) return false;
    cie->ra = ra;
  } else if (!c.Uleb(&cie->ra)) {
    return false;
  }
  if (aug[0] == 'z') {
    cie->z = true;
    uint64_t len;
    if (!c.Uleb(&len) || !c.Has(len)) return false;
    Cursor data{c.p, c.p + len};
    for (const char* a = aug + 1; *a != '\0'; ++a) {
      uint8_t enc;
      uintptr_t ignored;
      if (*a == 'R') {
        if (!data.Fixed(&cie->fde_enc)) return false;
      } else if (*a == 'P') {
        if (!data.Fixed(&enc) || !data.Encoded(enc & 0x7f, 0, &ignored)) return false;
      } else if (*a == 'L') {
        if (!data.Fixed(&enc)) return false;
      } else if (*a == 'S') {
        cie->signal = true;
      } else if (*a != 'B' && *a != 'G') {
        return false;
      }
    }
    c.p += len;
  } else if (aug[0] != '\0') {
    return false;
  }
  if (cie->ra >= kRegs) return false;
  cie->insns = c;
  return true;
}

// The FDE covering `pc` in the object that holds it, with its CIE; false
// when `pc` is in no object, or the object has no entry for it.
bool FindFde(uintptr_t pc, Cie* cie, uintptr_t* start, Cursor* insns) {
  dl_find_object object;
  if (_dl_find_object(reinterpret_cast<void*>(pc), &object) != 0 || object.dlfo_eh_frame == nullptr) {
    return false;
  }
  const uint8_t* hdr = static_cast<const uint8_t*>(object.dlfo_eh_frame);
  const uintptr_t base = reinterpret_cast<uintptr_t>(hdr);
  if (hdr[0] != 1 || hdr[3] != 0x3b) return false;  // version 1, a datarel|sdata4 table (all linkers)
  Cursor c{hdr + 4, hdr + 4 + 16};
  uintptr_t eh_frame, count;
  if (!c.Encoded(hdr[1], base, &eh_frame) || !c.Encoded(hdr[2], base, &count) || count == 0) {
    return false;
  }
  const uint8_t* table = c.p;  // count pairs of int32: initial location, FDE, both from hdr
  auto entry = [&](uintptr_t i, int which) {
    int32_t v;
    memcpy(&v, table + i * 8 + which * 4, 4);
    return base + static_cast<intptr_t>(v);
  };
  if (pc < entry(0, 0)) return false;
  uintptr_t lo = 0, hi = count;  // the last entry whose location is <= pc
  while (hi - lo > 1) {
    const uintptr_t mid = lo + (hi - lo) / 2;
    (entry(mid, 0) <= pc ? lo : hi) = mid;
  }
  const uint8_t* fde = reinterpret_cast<const uint8_t*>(entry(lo, 1));
  uint32_t length, cie_offset;
  memcpy(&length, fde, 4);
  if (length == 0 || length == 0xffffffffu) return false;
  Cursor f{fde + 4, fde + 4 + length};
  const uint8_t* cie_field = f.p;
  if (!f.Fixed(&cie_offset) || cie_offset == 0) return false;
  if (!ParseCie(cie_field - cie_offset, cie)) return false;
  uintptr_t range;
  if (!f.Encoded(cie->fde_enc, 0, start) || !f.Encoded(cie->fde_enc & 0x0f, 0, &range)) return false;
  if (pc < *start || pc - *start >= range) return false;
  if (cie->z) {
    uint64_t len;
    if (!f.Uleb(&len) || !f.Skip(len)) return false;
  }
  *insns = f;
  return true;
}

// Runs call-frame instructions into `row` up to the row for `target`
// (rows at locations <= target). `initial`: the CIE's row, for restore.
bool Execute(Cursor c, const Cie& cie, uintptr_t loc, uintptr_t target, const Row* initial, Row* row) {
  // remember_state's stack, raw: most functions never use it, and 8 rows
  // constructed on every call cost more than the rest of a frame's walk
  static_assert(std::is_trivially_copyable_v<Row>);
  alignas(Row) unsigned char saved[8][sizeof(Row)];
  int depth = 0;
  auto set = [&](uint64_t reg, How how, int64_t n, const uint8_t* expr = nullptr) {
    if (reg < kRegs) row->rules[reg] = Rule{how, n, expr};
  };
  auto restore = [&](uint64_t reg) {
    if (reg < kRegs) row->rules[reg] = initial != nullptr ? initial->rules[reg] : Rule{};
  };
  while (c.p < c.end) {
    const uint8_t op = *c.p++;
    uint64_t reg = 0, u = 0;
    int64_t s = 0;
    switch (op >> 6) {
      case 1:
        loc += (op & 0x3f) * cie.code_align;
        if (loc > target) return true;
        continue;
      case 2:
        if (!c.Uleb(&u)) return false;
        set(op & 0x3f, How::kOffset, static_cast<int64_t>(u) * cie.data_align);
        continue;
      case 3:
        restore(op & 0x3f);
        continue;
    }
    switch (op) {
      case 0x00: break;  // nop
      case 0x01:         // set_loc
        if (!c.Encoded(cie.fde_enc, 0, &loc)) return false;
        if (loc > target) return true;
        break;
      case 0x02: case 0x03: case 0x04: {  // advance_loc1/2/4
        if (op == 0x02) { uint8_t d; if (!c.Fixed(&d)) return false; u = d; }
        if (op == 0x03) { uint16_t d; if (!c.Fixed(&d)) return false; u = d; }
        if (op == 0x04) { uint32_t d; if (!c.Fixed(&d)) return false; u = d; }
        loc += u * cie.code_align;
        if (loc > target) return true;
        break;
      }
      case 0x05:  // offset_extended
        if (!c.Uleb(&reg) || !c.Uleb(&u)) return false;
        set(reg, How::kOffset, static_cast<int64_t>(u) * cie.data_align);
        break;
      case 0x06:  // restore_extended
        if (!c.Uleb(&reg)) return false;
        restore(reg);
        break;
      case 0x07:  // undefined
        if (!c.Uleb(&reg)) return false;
        set(reg, How::kUndefined, 0);
        break;
      case 0x08:  // same_value
        if (!c.Uleb(&reg)) return false;
        set(reg, How::kSame, 0);
        break;
      case 0x09:  // register
        if (!c.Uleb(&reg) || !c.Uleb(&u)) return false;
        set(reg, How::kRegister, static_cast<int64_t>(u));
        break;
      case 0x0a:  // remember_state
        if (depth == 8) return false;
        memcpy(saved[depth++], row, sizeof(Row));
        break;
      case 0x0b:  // restore_state
        if (depth == 0) return false;
        memcpy(row, saved[--depth], sizeof(Row));
        break;
      case 0x0c:  // def_cfa
        if (!c.Uleb(&reg) || !c.Uleb(&u)) return false;
        row->cfa_reg = reg;
        row->cfa_offset = static_cast<int64_t>(u);
        row->cfa_expr = nullptr;
        break;
      case 0x0d:  // def_cfa_register
        if (!c.Uleb(&reg)) return false;
        row->cfa_reg = reg;
        row->cfa_expr = nullptr;
        break;
      case 0x0e:  // def_cfa_offset
        if (!c.Uleb(&u)) return false;
        row->cfa_offset = static_cast<int64_t>(u);
        break;
      case 0x0f:  // def_cfa_expression
        if (!c.Uleb(&u) || !c.Has(u)) return false;
        row->cfa_expr = c.p;
        row->cfa_expr_len = u;
        c.p += u;
        break;
      case 0x10: case 0x16: {  // expression, val_expression
        if (!c.Uleb(&reg) || !c.Uleb(&u) || !c.Has(u)) return false;
        set(reg, op == 0x10 ? How::kExpr : How::kValExpr, static_cast<int64_t>(u), c.p);
        c.p += u;
        break;
      }
      case 0x11:  // offset_extended_sf
        if (!c.Uleb(&reg) || !c.Sleb(&s)) return false;
        set(reg, How::kOffset, s * cie.data_align);
        break;
      case 0x12:  // def_cfa_sf
        if (!c.Uleb(&reg) || !c.Sleb(&s)) return false;
        row->cfa_reg = reg;
        row->cfa_offset = s * cie.data_align;
        row->cfa_expr = nullptr;
        break;
      case 0x13:  // def_cfa_offset_sf
        if (!c.Sleb(&s)) return false;
        row->cfa_offset = s * cie.data_align;
        break;
      case 0x14:  // val_offset
        if (!c.Uleb(&reg) || !c.Uleb(&u)) return false;
        set(reg, How::kValOffset, static_cast<int64_t>(u) * cie.data_align);
        break;
      case 0x15:  // val_offset_sf
        if (!c.Uleb(&reg) || !c.Sleb(&s)) return false;
        set(reg, How::kValOffset, s * cie.data_align);
        break;
      case 0x2e:  // GNU_args_size
        if (!c.Uleb(&u)) return false;
        break;
      case 0x2f:  // GNU_negative_offset_extended
        if (!c.Uleb(&reg) || !c.Uleb(&u)) return false;
        set(reg, How::kOffset, -static_cast<int64_t>(u) * cie.data_align);
        break;
      default:
        return false;
    }
  }
  return true;
}

// A DWARF expression over the frame's registers, reading memory only inside
// the window; `push` is pushed first (the CFA, for register rules).
bool Evaluate(const uint8_t* expr, uint64_t len, const Regs& regs, const Window& window,
              const uintptr_t* push, uintptr_t* out) {
  uintptr_t stack[16];
  int n = 0;
  if (push != nullptr) stack[n++] = *push;
  Cursor c{expr, expr + len};
  while (c.p < c.end) {
    const uint8_t op = *c.p++;
    uint64_t u = 0;
    int64_t s = 0;
    if (n == 16) return false;
    if (op >= 0x30 && op <= 0x4f) {  // lit0-31
      stack[n++] = op - 0x30;
      continue;
    }
    if (op >= 0x70 && op <= 0x8f) {  // breg0-31
      const int reg = op - 0x70;
      if (reg >= kRegs || !regs.known[reg] || !c.Sleb(&s)) return false;
      stack[n++] = regs.value[reg] + static_cast<uintptr_t>(s);
      continue;
    }
    switch (op) {
      case 0x06:  // deref
        if (n < 1 || !window.Read(stack[n - 1], &stack[n - 1])) return false;
        break;
      case 0x08: { uint8_t v; if (!c.Fixed(&v)) return false; stack[n++] = v; break; }
      case 0x09: { int8_t v; if (!c.Fixed(&v)) return false; stack[n++] = static_cast<uintptr_t>(int64_t{v}); break; }
      case 0x0a: { uint16_t v; if (!c.Fixed(&v)) return false; stack[n++] = v; break; }
      case 0x0b: { int16_t v; if (!c.Fixed(&v)) return false; stack[n++] = static_cast<uintptr_t>(int64_t{v}); break; }
      case 0x0c: { uint32_t v; if (!c.Fixed(&v)) return false; stack[n++] = v; break; }
      case 0x0d: { int32_t v; if (!c.Fixed(&v)) return false; stack[n++] = static_cast<uintptr_t>(int64_t{v}); break; }
      case 0x0e: case 0x0f: { uint64_t v; if (!c.Fixed(&v)) return false; stack[n++] = v; break; }
      case 0x10: if (!c.Uleb(&u)) return false; stack[n++] = u; break;
      case 0x11: if (!c.Sleb(&s)) return false; stack[n++] = static_cast<uintptr_t>(s); break;
      case 0x12: if (n < 1) return false; stack[n] = stack[n - 1]; ++n; break;  // dup
      case 0x1a: if (n < 2) return false; --n; stack[n - 1] &= stack[n]; break;  // and
      case 0x1c: if (n < 2) return false; --n; stack[n - 1] -= stack[n]; break;  // minus
      case 0x22: if (n < 2) return false; --n; stack[n - 1] += stack[n]; break;  // plus
      case 0x23: if (n < 1 || !c.Uleb(&u)) return false; stack[n - 1] += u; break;  // plus_uconst
      default: return false;
    }
  }
  if (n < 1) return false;
  *out = stack[n - 1];
  return true;
}

// The calling thread's own stack as glibc knows it, asked once per thread
// (pthread_getattr_np: for the main thread it reads /proc/self/maps once);
// {0, 0} when unknown. Every byte from a stack pointer inside it to its end
// is mapped and readable.
struct ThreadStack {
  uintptr_t lo = 0, hi = 0;
  bool asked = false;
};
thread_local ThreadStack t_stack LAZYPIN_TLS;

const ThreadStack& OwnStack() {
  if (t_stack.asked) return t_stack;
  t_stack.asked = true;
  pthread_attr_t attr;
  // (sched_getaffinity, which it calls, is not for a thread under a seccomp filter)
  if (SeccompFiltered() || pthread_getattr_np(pthread_self(), &attr) != 0) return t_stack;
  void* addr = nullptr;
  size_t size = 0;
  if (pthread_attr_getstack(&attr, &addr, &size) == 0 && size != 0) {
    t_stack.lo = reinterpret_cast<uintptr_t>(addr);
    t_stack.hi = t_stack.lo + size;
  }
  pthread_attr_destroy(&attr);
  return t_stack;
}

// The window for a walk from `sp`: to the end of the thread's own stack when
// sp is on it, else (a fiber's or a signal stack) to the end of the mapping
// that holds sp, asked each time (such a mapping may be gone by the next walk).
Window StackWindow(uintptr_t sp) {
  const ThreadStack& own = OwnStack();
  if (sp >= own.lo && sp < own.hi) return Window{sp, own.hi};
  Window window;
  ForEachMapping(sp, sp + 1, [&](const Mapping& m) {
    if (m.lo <= sp && sp < m.hi && m.readable) window = Window{sp, m.hi};
    return false;
  });
  return window;
}

// One frame up: `regs` (pc in regs.value[kRa]) becomes the caller's. False
// at the end of the stack or at anything not trusted.
bool Step(Regs* regs, bool exact, const Window& window, bool* caller_exact) {
  const uintptr_t pc = regs->value[kRa];
  const uintptr_t lookup = exact ? pc : pc - 1;  // a return address may follow the function's end
  Cie cie;
  uintptr_t start;
  Cursor insns{nullptr, nullptr};
  if (!FindFde(lookup, &cie, &start, &insns)) return false;
  Row initial;
  if (!Execute(cie.insns, cie, 0, ~uintptr_t{0}, nullptr, &initial)) return false;
  Row row = initial;
  if (!Execute(insns, cie, start, lookup, &initial, &row)) return false;
  uintptr_t cfa;
  if (row.cfa_expr != nullptr) {
    if (!Evaluate(row.cfa_expr, row.cfa_expr_len, *regs, window, nullptr, &cfa)) return false;
  } else {
    if (row.cfa_reg >= kRegs || !regs->known[row.cfa_reg]) return false;
    cfa = regs->value[row.cfa_reg] + static_cast<uintptr_t>(row.cfa_offset);
  }
  // The caller's stack pointer is the CFA: inside the window, and up the
  // stack (so the walk ends), except out of a signal trampoline's frame.
  if (cfa < window.lo || cfa > window.hi) return false;
  if (!cie.signal && regs->known[kSp] && cfa <= regs->value[kSp]) return false;
  Regs next = *regs;
  for (int r = 0; r < kRegs; ++r) {
    const Rule& rule = row.rules[r];
    uintptr_t v = 0;
    switch (rule.how) {
      case How::kSame: continue;
      case How::kUndefined: next.known[r] = false; continue;
      case How::kOffset:
        if (!window.Read(cfa + static_cast<uintptr_t>(rule.n), &v)) return false;
        break;
      case How::kValOffset: v = cfa + static_cast<uintptr_t>(rule.n); break;
      case How::kRegister:
        if (rule.n < 0 || rule.n >= kRegs || !regs->known[rule.n]) return false;
        v = regs->value[rule.n];
        break;
      case How::kExpr:
        if (!Evaluate(rule.expr, static_cast<uint64_t>(rule.n), *regs, window, &cfa, &v) ||
            !window.Read(v, &v)) {
          return false;
        }
        break;
      case How::kValExpr:
        if (!Evaluate(rule.expr, static_cast<uint64_t>(rule.n), *regs, window, &cfa, &v)) return false;
        break;
    }
    next.value[r] = v;
    next.known[r] = true;
  }
  if (cie.ra != kRa) {  // the return address lives in another column
    next.value[kRa] = next.value[cie.ra];
    next.known[kRa] = next.known[cie.ra];
  }
  if (row.rules[cie.ra].how == How::kUndefined || !next.known[kRa] || next.value[kRa] == 0) {
    return false;  // the outermost frame
  }
  next.value[kSp] = cfa;
  next.known[kSp] = true;
  *regs = next;
  *caller_exact = cie.signal;
  return true;
}

}  // namespace

__attribute__((noinline)) size_t SafeBacktrace(uintptr_t* frames, size_t capacity, uintptr_t skip_lo,
                                               uintptr_t skip_hi) {
  if (capacity == 0) return 0;
  // This frame's registers at one instruction: its address, the stack
  // pointer and the callee-saved registers (the rest are not needed to unwind).
  uintptr_t at[8];
  asm volatile(
      "lea 0(%%rip), %%rax\n\t"
      "mov %%rax, 0(%0)\n\t"
      "mov %%rsp, 8(%0)\n\t"
      "mov %%rbp, 16(%0)\n\t"
      "mov %%rbx, 24(%0)\n\t"
      "mov %%r12, 32(%0)\n\t"
      "mov %%r13, 40(%0)\n\t"
      "mov %%r14, 48(%0)\n\t"
      "mov %%r15, 56(%0)\n\t"
      :
      : "r"(at)
      : "rax", "memory");
  Regs regs;
  const int numbers[8] = {kRa, kSp, 6, 3, 12, 13, 14, 15};
  for (int i = 0; i < 8; ++i) {
    regs.value[numbers[i]] = at[i];
    regs.known[numbers[i]] = true;
  }
  const Window window = StackWindow(at[1]);
  if (window.hi == 0) return 0;
  size_t count = 0;
  bool exact = true;  // this frame's address is the instruction itself
  for (size_t step = 0; step < capacity + kMaxSteps && count < capacity; ++step) {
    bool caller_exact = false;
    if (!Step(&regs, exact, window, &caller_exact)) break;
    exact = caller_exact;
    const uintptr_t pc = regs.value[kRa];
    if (pc >= skip_lo && pc < skip_hi) continue;
    frames[count++] = pc;
  }
  return count;
}

#else  // not x86-64: libgcc's unwinder

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
}  // namespace

size_t SafeBacktrace(uintptr_t* frames, size_t capacity, uintptr_t skip_lo, uintptr_t skip_hi) {
  if (capacity == 0) return 0;
  Unwinding u{frames, capacity, 0, skip_lo, skip_hi};
  _Unwind_Backtrace(&OnFrame, &u);
  return u.count;
}

#endif

}  // namespace lazypin
