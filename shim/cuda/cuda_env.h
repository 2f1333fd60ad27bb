// cuda_env: the CUDA side of DispatchEnv (core/dispatch.h), through the real
// driver: the current context and device, the capture rule, the one wait
// lazypin makes for the program (WaitForDevice), primary-context state, the
// pageable-copy stream wait. Where a call's record goes is Dispatch's other
// port (CallSink: the recorder).
#pragma once

#include "dispatch.h"
#include "sys.h"

namespace lazypin {

class CudaEnv : public DispatchEnv {
 public:
  int64_t NowNs() override { return MonotonicNs(); }
  Context CurrentContext() override;
  int DeviceOf(Context ctx) override;
  bool CaptureForbidsDeferral() override;
  int WaitForDevice(Context ctx) override;
  bool PrimaryContextActive(int device) override;
  Context ActivePrimaryContext(int device) override;
  int RecordedDevice() override;
  void SynchronizeStream(void* stream) override;
  bool StreamIdle(void* stream) override;

  // cuDriverGetVersion's answer, 0 when unknown.
  int DriverVersion();
};

}  // namespace lazypin
