// A library whose .bss is watched, dlclose'd and loaded again (mem_watch_test).
extern "C" {
alignas(4096) char watch_bss[1 << 20];
}
