// pyframe: the Python line that made a call, in a Python program. The native
// stack of a Python program is mostly the interpreter's; what names the code
// that pinned is the innermost Python frame of the calling thread.
//
// Read through the interpreter's own C API, found with dlsym in the process
// (nothing is loaded, nothing linked), and only when it is safe to call: the
// interpreter is initialized and not finalizing, and the calling thread holds
// the GIL (PyGILState_Check), as it does when an extension calls CUDA without
// releasing it (CuPy's and Numba's register paths). When the GIL is released
// (PyTorch's allocator), there is no Python frame to read safely: none is named.
// Any exception the program had set is kept as it was.
#pragma once

#include <string>

namespace lazypin {

// "path/to/file.py:12 in function", or "" when there is none or it may not be read.
std::string PythonFrame();

}  // namespace lazypin
