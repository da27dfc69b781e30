extern "C" __global__ void k(int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x
    if (i < n) out[i] = -1;
}
