extern "C" __global__ void k(int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = -1;
    if (i == 0) out[n + 5] = 0;  // one stray write past the end of the output
}
