// Never finishes: it spins until a value appears in its output that nothing writes
// (the judge poisons outputs). A spin on a local volatile was deleted by the compiler as
// an infinite loop without side effects; an atomic read of global memory cannot be.
extern "C" __global__ void k(int* out, int n) {
    while (atomicAdd(&out[n - 1], 0) != 0x5eed) { }
    out[0] = n;
}
