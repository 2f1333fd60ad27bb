// pyframe: the Python line that made a call, in a Python program. The native
// stack of a Python program is mostly the interpreter's; what names the code
// that pinned is the innermost Python frame of the calling thread.
//
// Read through the interpreter's own C API, found with dlsym in the process
// (nothing is loaded, nothing linked; CPython 3.10 or later), and only when it
// is safe to call: the interpreter is initialized and not finalizing, and the
// calling thread holds the GIL (PyGILState_Check, and its thread state is the
// current one: sub-interpreters make the check alone answer yes everywhere),
// as it does when an extension calls CUDA without releasing it (CuPy's and
// Numba's register paths). The garbage collector is off meanwhile (making a
// frame object allocates): no finalizer runs inside the hook. When the GIL is released
// (PyTorch's allocator), there is no Python frame to read safely: none is named.
// Any exception the program had set is kept as it was.
#pragma once

#include <string>

namespace lazypin {

// "path/to/file.py:12 in function", or "" when there is none or it may not be read.
std::string PythonFrame();

// Looks the interpreter's API up now (PythonFrame does on its first call);
// once per process: an interpreter loaded later is not seen.
void PreparePythonFrame();

// Whether PythonFrame may name a line in this process: an interpreter's API
// was found (by PreparePythonFrame or the first PythonFrame; false before).
// One relaxed load, any thread.
bool PythonFramePossible();

}  // namespace lazypin
