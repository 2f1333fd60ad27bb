// nvtx: ranges and markers in the "lazypin" domain (see nvtx.h).
#include "nvtx.h"

#include <stdio.h>

#include "nvtx3/nvToolsExt.h"

namespace lazypin::nvtx {
namespace {

nvtxDomainHandle_t Domain() {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("lazypin");
  return domain;
}

nvtxEventAttributes_t Attributes(const char* text, uint32_t argb) {
  nvtxEventAttributes_t a = {};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.colorType = NVTX_COLOR_ARGB;
  a.color = argb;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = text;
  return a;
}

constexpr uint32_t kGreen = 0xff2e9e44, kBlue = 0xff3a6fd8, kGrey = 0xff8a8a8a, kRed = 0xffd0342c;

void Mark(const char* text, uint32_t argb) {
  const nvtxEventAttributes_t a = Attributes(text, argb);
  nvtxDomainMarkEx(Domain(), &a);
}

}  // namespace

void CallBegins(Api api) {
  const nvtxEventAttributes_t a = Attributes(ApiName(api), kGrey);
  nvtxDomainRangePushEx(Domain(), &a);
}

void CallEnds(Action action, PassReason reason) {
  switch (action) {
    case Action::kHit: Mark("hit", kGreen); break;
    case Action::kDeferred: Mark("deferred", kBlue); break;
    case Action::kPassthrough: {
      char text[48];
      snprintf(text, sizeof(text), "passthrough%s%s", reason == PassReason::kNone ? "" : ":",
               reason == PassReason::kNone ? "" : PassReasonName(reason));
      Mark(text, kGrey);
      break;
    }
    case Action::kForward:
    case Action::kMiss: break;  // the range says it: the driver did the work
  }
  nvtxDomainRangePop(Domain());
}

void Evicted(EvictReason reason, bool forced) {
  char text[48];
  snprintf(text, sizeof(text), "evict:%s%s", EvictReasonName(reason), forced ? ":forced" : "");
  Mark(text, kRed);
}

void AutoPinned(bool ok) { Mark(ok ? "autopin" : "autopin:refused", ok ? kGreen : kGrey); }

}  // namespace lazypin::nvtx
