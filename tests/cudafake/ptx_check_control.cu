// Negative controls of ptx_rounding_check.cmake: premulsum written the way
// the reduction kernels must not be, compiled with nvcc's defaults
// (--fmad=true). SHOAL_CONTROL_FMA: plain a * s + b, which nvcc contracts
// into fma.rn.f32. Otherwise: a plain float add (add.f32, no rounding
// modifier), which ptxas would be free to fuse with a multiply. The check
// must reject both (tests/cudafake/library_tests.cmake).
extern "C" __global__ void shoal_reduce_premulsum_float(float* dst, const float* a, const float* b,
                                                        unsigned long long count, const float* scalar,
                                                        unsigned long long) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += gridDim.x * blockDim.x) {
#if defined(SHOAL_CONTROL_FMA)
    dst[i] = a[i] * *scalar + b[i];
#else
    dst[i] = __fmul_rn(a[i], *scalar) + b[i];
#endif
  }
}
