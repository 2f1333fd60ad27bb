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

// The stable C API functions used (present in CPython 3.9 and later).
struct PythonApi {
  int (*is_initialized)();
  int (*is_finalizing)();  // Py_IsFinalizing (3.13) or _Py_IsFinalizing (3.7-3.12)
  int (*gil_check)();
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
    const bool all = get(&a.is_initialized, "Py_IsInitialized") && a.is_finalizing != nullptr &&
                     get(&a.get_frame, "PyEval_GetFrame") &&
                     get(&a.line_number, "PyFrame_GetLineNumber") &&
                     get(&a.frame_code, "PyFrame_GetCode") &&
                     get(&a.get_attr, "PyObject_GetAttrString") &&
                     get(&a.as_utf8, "PyUnicode_AsUTF8") && get(&a.dec_ref, "Py_DecRef") &&
                     get(&a.err_fetch, "PyErr_Fetch") && get(&a.err_restore, "PyErr_Restore");
    return all ? &a : nullptr;
  }();
  return api;
}

}  // namespace

std::string PythonFrame() {
  const PythonApi* py = Api();
  if (py == nullptr || !py->is_initialized() || py->is_finalizing() || py->gil_check() != 1) {
    return "";
  }
  Object frame = py->get_frame();
  if (frame == nullptr) return "";
  Object type, value, traceback;
  py->err_fetch(&type, &value, &traceback);
  std::string where;
  const int line = py->line_number(frame);
  if (Object code = py->frame_code(frame)) {
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
  py->err_restore(type, value, traceback);  // drops whatever the lookups set
  return where;
}

}  // namespace lazypin
