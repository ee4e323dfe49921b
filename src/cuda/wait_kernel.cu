// The wait kernel: the fallback where a device has no 64-bit stream memory
// operations (docs/cuda.md). One thread polls a 64-bit word in pinned host
// memory until (int64_t)(*word - value) >= 0, as cuStreamWaitValue64 with
// CU_STREAM_WAIT_VALUE_GEQ would, backing off with __nanosleep; an optional
// abort word ends the wait early. Compiled to PTX at build time (nvcc -ptx),
// embedded in libnccl.so.2 and loaded with cuModuleLoadData: no CUDA runtime.
extern "C" __global__ void shoal_wait_u64(const volatile unsigned long long* word,
                                          unsigned long long value,
                                          const volatile unsigned int* abortWord) {
  unsigned ns = 64;
  while (static_cast<long long>(*word - value) < 0) {
    if (abortWord != nullptr && *abortWord != 0) return;
    __nanosleep(ns);
    if (ns < 8192) ns *= 2;
  }
  __threadfence_system();
}
