// StackKey (telemetry/recorder.h): which program calls get a stack, and which
// of them share one (unwound once per key).
#include <cstdint>
#include <optional>

#include "gtest/gtest.h"
#include "recorder.h"

namespace lazypin {
namespace {

constexpr uint64_t kWhat = uint64_t{3} << 8;  // an API and its flags

ProgramCall Native(uintptr_t pc, uintptr_t frame, void* ptr, size_t bytes) {
  ProgramCall call{Api::kCuMemHostRegister, Via::kSymbol, ptr, bytes, 0};
  call.caller.pc = pc;
  call.caller.frame = frame;
  return call;
}

void* At(uintptr_t p) { return reinterpret_cast<void*>(p); }

std::optional<uint64_t> Key(const ProgramCall& call, Action action = Action::kMiss,
                            StackMode mode = StackMode::kDriver, bool python = false,
                            uint64_t what = kWhat) {
  return StackKey(mode, action, what, call, python);
}

TEST(StackKeyTest, HitsAndDeferralsHaveNoStackUnlessEveryCallIsAsked) {
  const ProgramCall call = Native(0x401000, 0x7ffe000, At(0x10000), 4096);
  EXPECT_FALSE(Key(call, Action::kHit).has_value());
  EXPECT_FALSE(Key(call, Action::kDeferred).has_value());
  ASSERT_TRUE(Key(call, Action::kMiss).has_value());
  ASSERT_TRUE(Key(call, Action::kForward).has_value());
  // LAZYPIN_STACKS=all: every call, hits too, unwound each time (key 0).
  EXPECT_EQ(Key(call, Action::kHit, StackMode::kAll), std::optional<uint64_t>(0));
  EXPECT_EQ(Key(call, Action::kMiss, StackMode::kAll), std::optional<uint64_t>(0));
}

TEST(StackKeyTest, ANativeCallerIsItsLineFrameAndSizeNotItsBuffer) {
  const ProgramCall call = Native(0x401000, 0x7ffe000, At(0x10000), 4096);
  const uint64_t key = *Key(call);
  EXPECT_NE(key, 0u);
  EXPECT_EQ(key & 1, 1u);
  // A new buffer of the same size from the same line: the same stack.
  EXPECT_EQ(*Key(Native(0x401000, 0x7ffe000, At(0x20000), 4096)), key);
  // Another line, another frame, another size, another API or flags: another.
  EXPECT_NE(*Key(Native(0x401010, 0x7ffe000, At(0x10000), 4096)), key);
  EXPECT_NE(*Key(Native(0x401000, 0x7ffd000, At(0x10000), 4096)), key);
  EXPECT_NE(*Key(Native(0x401000, 0x7ffe000, At(0x10000), 8192)), key);
  EXPECT_NE(*Key(call, Action::kMiss, StackMode::kDriver, false, kWhat | 1), key);
}

TEST(StackKeyTest, WithoutAUsableCallerTheBufferAndSizeAreTheKey) {
  // A Python interpreter may be the caller, an entry point cuGetProcAddress
  // handed out (the runtime calls it for every line), or no caller known.
  ProgramCall getproc = Native(0x401000, 0x7ffe000, At(0x10000), 4096);
  getproc.via = Via::kGetProc;
  const ProgramCall unknown = Native(0, 0, At(0x10000), 4096);
  const ProgramCall native = Native(0x401000, 0x7ffe000, At(0x10000), 4096);
  const uint64_t by_buffer = *Key(unknown);
  EXPECT_EQ(*Key(getproc), by_buffer);
  EXPECT_EQ(*Key(native, Action::kMiss, StackMode::kDriver, /*python=*/true), by_buffer);
  EXPECT_EQ(by_buffer & 1, 1u);
  // The caller does not count; the buffer does.
  ProgramCall other_line = getproc;
  other_line.caller.pc = 0x402000;
  EXPECT_EQ(*Key(other_line), by_buffer);
  EXPECT_NE(*Key(Native(0, 0, At(0x20000), 4096)), by_buffer);
  EXPECT_NE(*Key(Native(0, 0, At(0x10000), 8192)), by_buffer);
}

}  // namespace
}  // namespace lazypin
