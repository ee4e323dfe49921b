/*
 * Test-only control surface of the CUDA driver stand-in (libshoal_cudafake.so).
 *
 * The stand-in exports the CUDA driver API entry points Shoal resolves through
 * cuGetProcAddress_v2 (see README.md in this folder). The functions below are
 * NOT part of CUDA: tests call them to steer the stand-in (knobs) and to look
 * at what the code under test did (counters). They may be called at any time,
 * before or after cuInit, from any thread, and are never counted as CUDA calls
 * nor flagged as CUDA calls made from inside a host function.
 */
#ifndef SHOAL_TESTS_CUDAFAKE_FAKE_CUDA_H
#define SHOAL_TESTS_CUDAFAKE_FAKE_CUDA_H

#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueues a pause of `ms` milliseconds on `stream` (0, CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD name the current context's default stream), as a long
 * kernel would: later work on that stream starts only after it. Returns what
 * an enqueue would (CUDA_ERROR_INVALID_HANDLE for an unknown stream, ...).
 * While the stream is capturing, the pause is recorded and not run. */
CUresult shoalFakeCudaStreamDelay(CUstream stream, unsigned ms);

/* Stream memory operations (cuStreamWaitValue*, cuStreamWriteValue*,
 * cuStreamBatchMemOp) on (1) or off (0: they return CUDA_ERROR_NOT_SUPPORTED
 * and CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS reads 0).
 * Environment: SHOAL_FAKECUDA_NO_MEMOPS=1. */
void shoalFakeCudaSetMemOps(int enabled);

/* Kernels on (1) or off (0: cuModuleLoadData returns CUDA_ERROR_NOT_SUPPORTED).
 * Environment: SHOAL_FAKECUDA_NO_KERNELS=1. */
void shoalFakeCudaSetKernels(int enabled);

/* Hides one kernel: cuModuleGetFunction of `name` returns CUDA_ERROR_NOT_FOUND
 * from now on, as if the module's image lacked it (NULL or "" clears).
 * Functions already returned keep working. Environment:
 * SHOAL_FAKECUDA_HIDE_KERNEL=name. */
void shoalFakeCudaHideKernel(const char* name);

/* Makes the n-th call (1-based) of the CUDA function `name`, counted from this
 * call on, return CUDA_ERROR_UNKNOWN without effect; n = 0 clears. `name` is
 * the base name (cuMemcpyAsync, cuMemAlloc); a versioned spelling such as
 * cuMemAlloc_v2 means the same function. One pending failure per function.
 * Environment: SHOAL_FAKECUDA_FAIL=name:n[,name:n...], where n counts from the
 * start of the process. */
void shoalFakeCudaFailNth(const char* name, int n);

/* How many times the CUDA function `name` (base or versioned name, as above)
 * has been called in this process, whatever it returned, including calls made
 * through pointers from cuGetProcAddress. */
unsigned long long shoalFakeCudaCallCount(const char* name);

/* How many reduction kernels were launched onto streams of device `device`
 * (its ordinal in this process) in this process (0 for a device out of
 * range). */
unsigned long long shoalFakeCudaReduceLaunchesOn(int device);

/* Every stream worker sleeps `ms` before each operation it runs (0: off).
 * Environment: SHOAL_FAKECUDA_STREAM_DELAY_MS=ms. */
void shoalFakeCudaSetStreamDelayMs(unsigned ms);

/* CUDA calls made from inside a host function (cuLaunchHostFunc) abort the
 * process when strict (1), or print a warning and return
 * CUDA_ERROR_NOT_PERMITTED when not (0, the default).
 * Environment: SHOAL_FAKECUDA_STRICT_HOSTFN=1. */
void shoalFakeCudaSetStrictHostFn(int strict);

/* Number of emulated devices cuInit creates. Only effective before the first
 * successful cuInit: returns 0 when applied, -1 when too late or out of range
 * (0..64). Environment: SHOAL_FAKECUDA_DEVICES=N (0 makes cuInit fail with
 * CUDA_ERROR_NO_DEVICE). */
int shoalFakeCudaSetDevices(int count);

/* Leak checks. Live streams: created by cuStreamCreate* and not yet passed to
 * cuStreamDestroy (the per-context default streams are not counted).
 * Live allocations: cuMemAlloc/cuMemAllocManaged/cuMemAllocAsync, cuMemHostAlloc/
 * cuMemAllocHost and cuMemHostRegister ranges not yet freed or unregistered,
 * plus cuMemCreate/cuMemImportFromShareableHandle handles not yet released,
 * cuMemMap mappings not yet unmapped and cuMemAddressReserve ranges not yet
 * freed. */
int shoalFakeCudaLiveStreams(void);
int shoalFakeCudaLiveAllocations(void);
/* Events created by cuEventCreate and not yet destroyed. */
int shoalFakeCudaLiveEvents(void);

/* Number of CUDA calls made from inside host functions so far. */
unsigned long long shoalFakeCudaHostFnViolations(void);

#ifdef __cplusplus
}
#endif

#endif /* SHOAL_TESTS_CUDAFAKE_FAKE_CUDA_H */
