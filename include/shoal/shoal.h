/*
 * shoal/shoal.h -- Shoal's own C extensions to the NCCL API.
 *
 * Role: functions that exist only in Shoal's libnccl.so.2, all named shoal*.
 * A program that uses them needs Shoal; a program that only includes
 * <nccl.h> runs on NVIDIA NCCL as well. To use both libraries from one
 * binary, look these symbols up with dlsym and fall back when they are
 * missing.
 *
 * Language: C99 and C++ (C linkage). Thread safety: every function may be
 * called from any thread; a host stream may be used by one thread at a time,
 * like a communicator.
 */
#ifndef SHOAL_SHOAL_H_
#define SHOAL_SHOAL_H_

#include <stddef.h>

#include <nccl.h>

/* Version of Shoal itself (the NCCL version it implements is
 * NCCL_VERSION_CODE / ncclGetVersion). */
#define SHOAL_VERSION_MAJOR 0
#define SHOAL_VERSION_MINOR 1
#define SHOAL_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

/* A static, human-readable version string of the loaded library, such as
 * "shoal 0.1.0 (NCCL 2.30.7 API)". Never NULL; do not free. */
const char* shoalGetVersionString(void);

/* The loaded library's Shoal version (which may differ from the
 * SHOAL_VERSION_* this header was compiled with). Any of the pointers may be
 * NULL. Returns ncclSuccess. */
ncclResult_t shoalGetVersion(int* major, int* minor, int* patch);

/* ------------------------------------------------------------------------ */
/* Host streams: asynchronous collectives on host memory                   */
/* ------------------------------------------------------------------------ */

/*
 * Without a GPU, a collective on host memory with the NULL stream
 * ((cudaStream_t)0) is synchronous: it has completed when the call (or, in a
 * group, the outermost ncclGroupEnd) returns. A host stream makes such work
 * asynchronous, as a CUDA stream does for device memory:
 *
 *   shoalHostStream_t hs;
 *   shoalHostStreamCreate(&hs);
 *   ncclAllReduce(send, recv, n, ncclFloat, ncclSum, comm, (cudaStream_t)hs);
 *   ... overlap other CPU work; do not touch send/recv ...
 *   shoalHostStreamSynchronize(hs);   // recv is now valid
 *   shoalHostStreamDestroy(hs);
 *
 * The handle is passed, cast to cudaStream_t, wherever NCCL takes a stream.
 * Operations on one host stream run in the order they were enqueued; work on
 * different host streams may overlap. The buffers of an enqueued operation
 * must stay valid and unmodified until the stream has passed it. An error in
 * queued work becomes the communicator's asynchronous error
 * (ncclCommGetAsyncError). A host stream must not be given to a build of the
 * library that expects CUDA streams (NVIDIA NCCL).
 */
typedef struct shoalHostStream* shoalHostStream_t;

/* Creates an idle host stream. */
ncclResult_t shoalHostStreamCreate(shoalHostStream_t* s);

/* Blocks until every operation enqueued on s so far has completed; returns
 * the first error among them, or ncclSuccess. */
ncclResult_t shoalHostStreamSynchronize(shoalHostStream_t s);

/* Does not block: ncclSuccess when idle, ncclInProgress while work is
 * queued, or the error of failed work. */
ncclResult_t shoalHostStreamQuery(shoalHostStream_t s);

/* Waits for queued work, then frees the stream. NULL is a no-op. */
ncclResult_t shoalHostStreamDestroy(shoalHostStream_t s);

/* ------------------------------------------------------------------------ */
/* Diagnostics                                                              */
/* ------------------------------------------------------------------------ */

/* Writes a human-readable description of what comm is doing and waiting on
 * (pending operations, the peer and step each waits for, connection state,
 * async error) into buf as a NUL-terminated string, truncated to len bytes.
 * Safe to call from another thread while comm is busy, e.g. from a watchdog
 * that suspects a hang. Returns ncclInvalidArgument for a NULL comm or buf or
 * len == 0. */
ncclResult_t shoalCommDumpState(ncclComm_t comm, char* buf, size_t len);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SHOAL_SHOAL_H_ */
