// FakeDispatchEnv: the DispatchEnv of the dispatch tests. A clock that moves
// 10 ns a read, a settable current context, and checks of the contract every
// test relies on: CallStarts once before each Record, records made inside
// lazypin, waits in the current context.
#pragma once

#include <vector>

#include "dispatch.h"
#include "gtest/gtest.h"
#include "thread_state.h"

namespace lazypin {

inline const Context kFakeCtx = reinterpret_cast<Context>(0x11);

class FakeDispatchEnv final : public DispatchEnv, public CallSink {
 public:
  int64_t NowNs() override { return now += 10; }
  Context CurrentContext() override { return ctx; }
  int DeviceOf(Context c) override { return c != nullptr ? 0 : -1; }
  bool CaptureForbidsDeferral() override { return capture_forbids; }
  void CallStarts(const ProgramCall&) override { ++open; }
  void Record(const CallRecord& record) override {
    EXPECT_EQ(open, 1) << "CallStarts once before each Record";
    --open;
    EXPECT_GT(t_state.inside, 0) << "records are made inside lazypin";
    records.push_back(record);
  }
  int WaitForDevice(Context c) override {
    EXPECT_EQ(c, ctx) << "waits in the current context";
    ++waits;
    return wait_result;
  }
  bool PrimaryContextActive(int) override { return primary_active; }
  Context ActivePrimaryContext(int) override { return primary_ctx; }
  void SynchronizeStream(void* stream) override { synced.push_back(stream); }

  int64_t now = 0;
  Context ctx = kFakeCtx;
  bool capture_forbids = false;
  int open = 0;  // CallStarts without its Record yet
  std::vector<CallRecord> records;
  int waits = 0;
  int wait_result = 0;
  bool primary_active = true;
  Context primary_ctx = nullptr;  // what ActivePrimaryContext tells (null: cannot tell)
  std::vector<void*> synced;
};

}  // namespace lazypin
