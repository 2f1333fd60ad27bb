// nvtx_recorder: an NVTX injection library (NVTX_INJECTION64_PATH) that
// writes every domain create, range push/pop and marker a process makes to
// the file $NVTX_RECORD, one line each ("domain lazypin", "push <domain>
// <text>", "pop <domain>", "mark <domain> <text>"), so that tests can check
// the timeline lazypin gives Nsight Systems without one.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <vector>

#include "nvtx3/nvToolsExt.h"

namespace {

std::mutex g_mu;
std::vector<std::string>* g_domains = nullptr;  // index + 1 is the handle

void Write(const std::string& line) {
  const char* path = getenv("NVTX_RECORD");
  if (path == nullptr) return;
  const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;
  const std::string text = line + "\n";
  ssize_t ignored = write(fd, text.data(), text.size());
  (void)ignored;
  close(fd);
}

std::string DomainName(nvtxDomainHandle_t domain) {
  std::lock_guard<std::mutex> lock(g_mu);
  const size_t i = reinterpret_cast<size_t>(domain);
  return g_domains != nullptr && i >= 1 && i <= g_domains->size() ? (*g_domains)[i - 1] : "?";
}

std::string Text(const nvtxEventAttributes_t* a) {
  if (a == nullptr || a->messageType != NVTX_MESSAGE_TYPE_ASCII || a->message.ascii == nullptr) {
    return "";
  }
  return a->message.ascii;
}

nvtxDomainHandle_t DomainCreateA(const char* name) {
  size_t handle;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_domains == nullptr) g_domains = new std::vector<std::string>;
    g_domains->push_back(name != nullptr ? name : "");
    handle = g_domains->size();
  }
  Write(std::string("domain ") + (name != nullptr ? name : ""));
  return reinterpret_cast<nvtxDomainHandle_t>(handle);
}

int RangePushEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  Write("push " + DomainName(domain) + " " + Text(a));
  return 0;
}

int RangePop(nvtxDomainHandle_t domain) {
  Write("pop " + DomainName(domain));
  return 0;
}

void MarkEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  Write("mark " + DomainName(domain) + " " + Text(a));
}

template <typename Fn>
void Set(NvtxFunctionTable table, unsigned size, int id, Fn fn) {
  if (static_cast<unsigned>(id) < size && table[id] != nullptr) {
    *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || table == nullptr) {
    return 0;
  }
  Set(table, size, NVTX_CBID_CORE2_DomainCreateA, &DomainCreateA);
  Set(table, size, NVTX_CBID_CORE2_DomainRangePushEx, &RangePushEx);
  Set(table, size, NVTX_CBID_CORE2_DomainRangePop, &RangePop);
  Set(table, size, NVTX_CBID_CORE2_DomainMarkEx, &MarkEx);
  return 1;
}
