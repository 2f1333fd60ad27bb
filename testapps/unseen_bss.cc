// A library whose .bss the unseen app registers, dlclose's and loads again.
extern "C" {
alignas(4096) char unseen_bss[1 << 20];
}
