// shim: the one object that wires config, log, stats, pool, dispatch and the
// memory guard, and owns the process lifecycle: set-up in the program's first
// registration call, exit, fork, SIGTERM/SIGINT. It publishes what it set up
// as the ShimState (state.h) that the hooks read; nothing else calls into it.
// A program that never calls CUDA pays nothing.
#pragma once

#define LAZYPIN_EXPORT extern "C" __attribute__((visibility("default")))
