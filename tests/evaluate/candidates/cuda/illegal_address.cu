extern "C" __global__ void k(int* out, int n) {
    int* nowhere = (int*)0x10;
    nowhere[threadIdx.x] = n;  // faults: poisons this process's CUDA context
}
