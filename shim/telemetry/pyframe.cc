// pyframe: the calling thread's innermost Python frame (see pyframe.h).
#include "pyframe.h"

#include <dlfcn.h>

#include <atomic>
#include <type_traits>

#include "fmt/format.h"
#include "real.h"

namespace lazypin {
namespace {

using Object = void*;

std::atomic<bool> g_possible{false};  // set once, by Api()'s first call

// The stable C API functions used (present in CPython 3.9 and later).
struct PythonApi {
  int (*is_initialized)();
  int (*is_finalizing)();  // Py_IsFinalizing (3.13) or _Py_IsFinalizing (3.7-3.12)
  int (*gil_check)();
  // The thread's current state (PyThreadState_GetUnchecked, 3.13; before:
  // _PyThreadState_UncheckedGet) and the one PyGILState knows for it.
  Object (*current_state)();
  Object (*this_thread_state)();
  int (*gc_disable)();  // PyGC_Disable / PyGC_Enable (3.10): the previous state
  int (*gc_enable)();
  Object (*get_frame)();  // PyEval_GetFrame: borrowed
  int (*line_number)(Object frame);
  Object (*frame_code)(Object frame);  // new reference
  Object (*get_attr)(Object o, const char* name);  // new reference
  const char* (*as_utf8)(Object unicode);
  void (*dec_ref)(Object o);
  void (*err_fetch)(Object* type, Object* value, Object* traceback);
  void (*err_restore)(Object type, Object value, Object traceback);
};

// Resolved once; null when the process has no (usable) Python.
const PythonApi* Api() {
  static const PythonApi* const api = []() -> const PythonApi* {
    real::DlsymFn sym = real::Dlsym();
    if (sym == nullptr) return nullptr;
    static PythonApi a;
    const auto get = [&](auto* field, const char* name) {
      *field = reinterpret_cast<std::remove_pointer_t<decltype(field)>>(sym(RTLD_DEFAULT, name));
      return *field != nullptr;
    };
    if (!get(&a.gil_check, "PyGILState_Check")) return nullptr;  // no Python here
    if (!get(&a.is_finalizing, "Py_IsFinalizing")) get(&a.is_finalizing, "_Py_IsFinalizing");
    if (!get(&a.current_state, "PyThreadState_GetUnchecked")) {
      get(&a.current_state, "_PyThreadState_UncheckedGet");
    }
    const bool all = get(&a.is_initialized, "Py_IsInitialized") && a.is_finalizing != nullptr &&
                     a.current_state != nullptr &&
                     get(&a.this_thread_state, "PyGILState_GetThisThreadState") &&
                     get(&a.gc_disable, "PyGC_Disable") && get(&a.gc_enable, "PyGC_Enable") &&
                     get(&a.get_frame, "PyEval_GetFrame") &&
                     get(&a.line_number, "PyFrame_GetLineNumber") &&
                     get(&a.frame_code, "PyFrame_GetCode") &&
                     get(&a.get_attr, "PyObject_GetAttrString") &&
                     get(&a.as_utf8, "PyUnicode_AsUTF8") && get(&a.dec_ref, "Py_DecRef") &&
                     get(&a.err_fetch, "PyErr_Fetch") && get(&a.err_restore, "PyErr_Restore");
    g_possible.store(all, std::memory_order_relaxed);
    return all ? &a : nullptr;
  }();
  return api;
}

}  // namespace

void PreparePythonFrame() { Api(); }

bool PythonFramePossible() { return g_possible.load(std::memory_order_relaxed); }

std::string PythonFrame() {
  const PythonApi* py = Api();
  if (py == nullptr || !py->is_initialized() || py->is_finalizing() || py->gil_check() != 1) {
    return "";
  }
  // PyGILState_Check answers 1 on every thread once a sub-interpreter exists:
  // this thread must also be the one whose state is current.
  Object state = py->current_state();
  if (state == nullptr || state != py->this_thread_state()) return "";
  Object type, value, traceback;
  py->err_fetch(&type, &value, &traceback);
  // Making the frame object (3.11+) allocates, and an allocation may collect:
  // no finalizer of the program's may run inside a CUDA hook.
  const int gc_was_enabled = py->gc_disable();
  std::string where;
  Object frame = py->get_frame();
  const int line = frame != nullptr ? py->line_number(frame) : 0;
  if (Object code = frame != nullptr ? py->frame_code(frame) : nullptr) {
    Object file = py->get_attr(code, "co_filename");
    Object name = py->get_attr(code, "co_name");
    const char* file_text = file != nullptr ? py->as_utf8(file) : nullptr;
    const char* name_text = name != nullptr ? py->as_utf8(name) : nullptr;
    if (file_text != nullptr) {
      where = fmt::format("{}:{} in {}", file_text, line, name_text != nullptr ? name_text : "?");
    }
    if (name != nullptr) py->dec_ref(name);
    if (file != nullptr) py->dec_ref(file);
    py->dec_ref(code);
  }
  if (gc_was_enabled) py->gc_enable();
  py->err_restore(type, value, traceback);  // drops whatever the lookups set
  return where;
}

}  // namespace lazypin
