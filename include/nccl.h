/*
 * nccl.h -- Shoal's own header for the NCCL C API (NCCL 2.30.7 names and ABI).
 *
 * Role: the public C interface of Shoal's libnccl.so.2. Programs written for
 * NVIDIA NCCL compile against this header unchanged, and binaries built
 * against NVIDIA's header run against Shoal (and the other way round): every
 * name, enum value, struct layout and signature below follows NCCL 2.30.7.
 * It was written for Shoal from a description of that API and ABI; it is not
 * NVIDIA's file.
 *
 * Every function exists twice with the same signature: ncclX and pncclX.
 * The library defines pncclX and makes ncclX a weak alias of it, so that
 * profilers and interposers can override ncclX and forward to pncclX.
 *
 * The device-side API of NCCL (nccl_device.h) is not part of this header.
 *
 * Language: C99 and C++ (all declarations have C linkage).
 * CUDA: when <cuda_runtime.h> can be found it is included, as NCCL does, and
 * cudaStream_t is CUDA's type. Otherwise (or with SHOAL_NO_CUDA_HEADERS
 * defined) cudaStream_t is declared here as the same opaque pointer type
 * `struct CUstream_st*`, so code compiled either way is ABI-identical. With
 * Shoal, host-memory operations may pass a NULL stream ((cudaStream_t)0).
 */
#ifndef NCCL_H_
#define NCCL_H_

/* ------------------------------------------------------------------------ */
/* CUDA types                                                               */
/* ------------------------------------------------------------------------ */

/* __has_include is tested in its own #if because a preprocessor without it
 * cannot parse `__has_include(<...>)` even on the right of a false &&. */
#if !defined(SHOAL_NO_CUDA_HEADERS) && defined(__has_include)
#  if __has_include(<cuda_runtime.h>)
#    define SHOAL_NCCL_HAVE_CUDA_HEADERS 1
#  endif
#endif

#if defined(SHOAL_NCCL_HAVE_CUDA_HEADERS)
#  include <cuda_runtime.h>
#  include <cuda_fp16.h>
#  if CUDART_VERSION >= 11000
#    include <cuda_bf16.h>
#  endif
#  if defined(__cplusplus) && CUDART_VERSION >= 11080
#    include <cuda_fp8.h>
#  endif
#else
/* CUDA's own definition, repeated only when CUDA's driver_types.h has not
 * been seen: a C99 translation unit may not repeat a typedef. */
#  if !defined(__DRIVER_TYPES_H__) && !defined(SHOAL_CUDA_STREAM_T_DECLARED)
#    define SHOAL_CUDA_STREAM_T_DECLARED 1
typedef struct CUstream_st* cudaStream_t;
#  endif
#endif

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

#define NCCL_MAJOR 2
#define NCCL_MINOR 30
#define NCCL_PATCH 7
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 23007
/* Releases up to 2.8 encoded X*1000+Y*100+Z (2.8.4 -> 2804); later ones
 * X*10000+Y*100+Z (2.30.7 -> 23007). */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Handles and identifiers                                                  */
/* ------------------------------------------------------------------------ */

/* Opaque handle to a communicator. */
typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

/* Opaque handle to a registered window (ncclCommWindowRegister). */
typedef struct ncclWindow_vidmem* ncclWindow_t;

/* Rendezvous token made by ncclGetUniqueId on one rank and copied, by the
 * application, to every rank. Passed by value; contents are opaque. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* ------------------------------------------------------------------------ */
/* Enumerations                                                             */
/* ------------------------------------------------------------------------ */

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

/* Exists only so that ncclMaxRedOp below keeps sizeof(ncclRedOp_t) at the
 * size of a small enum (4 bytes): the ABI of every release since 2.11. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  /* Number of built-in operators; operators made by ncclRedOpCreate*
   * functions have values >= ncclNumOps. */
  ncclNumOps = 5,
  /* Largest valid operator value: the largest signed value that does not
   * grow the enum (0x7fffffff). */
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives. */
typedef enum {
  /* The pointer is kept and the scalar is read while the collective runs. */
  ncclScalarDevice = 0,
  /* The scalar is read on the host before ncclRedOpCreatePreMulSum returns. */
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* Statistics of ncclCommMemStats. */
typedef enum {
  ncclStatGpuMemSuspend = 0,
  ncclStatGpuMemSuspended = 1,
  ncclStatGpuMemPersist = 2,
  ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;

/* ------------------------------------------------------------------------ */
/* Constants and flags                                                      */
/* ------------------------------------------------------------------------ */

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f
/* ncclConfig_t.magic; a config not made with NCCL_CONFIG_INITIALIZER is
 * rejected with ncclInvalidArgument. */
#define NCCL_API_MAGIC 0xcafebeef

/* ncclConfig_t.CTAPolicy */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink shrinkFlags */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* ncclCommRevoke revokeFlags */
#define NCCL_REVOKE_DEFAULT 0x00

/* ncclCommSuspend flags */
#define NCCL_SUSPEND_MEM 0x01

/* ncclCommWindowRegister winFlags, and the alignment windows require. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* ------------------------------------------------------------------------ */
/* Communicator configuration                                               */
/* ------------------------------------------------------------------------ */

/* Fields are only ever appended; the library reads `size` bytes of the
 * caller's struct and resets every field newer than the caller's `version`
 * to its default, so binaries built against older headers keep working.
 * Always start from NCCL_CONFIG_INITIALIZER and then set what you need;
 * NCCL_CONFIG_UNDEF_INT / NCCL_CONFIG_UNDEF_PTR mean "library default". */
typedef struct ncclConfig_v23000 {
  /* Set by NCCL_CONFIG_INITIALIZER; never change them. */
  size_t size;
  unsigned int magic;
  unsigned int version;
  /* User attributes. */
  int blocking;            /* 1: calls block; 0: calls may return ncclInProgress */
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;     /* network to use, by name; NULL: automatic */
  int splitShare;          /* children of ncclCommSplit share resources */
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;           /* NCCL_CTA_POLICY_* */
  int shrinkShare;         /* children of ncclCommShrink share resources */
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER {                                   \
  sizeof(ncclConfig_t),        /* size */                           \
  NCCL_API_MAGIC,              /* magic */                          \
  NCCL_VERSION_CODE,           /* version */                        \
  NCCL_CONFIG_UNDEF_INT,       /* blocking */                       \
  NCCL_CONFIG_UNDEF_INT,       /* cgaClusterSize */                 \
  NCCL_CONFIG_UNDEF_INT,       /* minCTAs */                        \
  NCCL_CONFIG_UNDEF_INT,       /* maxCTAs */                        \
  NCCL_CONFIG_UNDEF_PTR,       /* netName */                        \
  NCCL_CONFIG_UNDEF_INT,       /* splitShare */                     \
  NCCL_CONFIG_UNDEF_INT,       /* trafficClass */                   \
  NCCL_CONFIG_UNDEF_PTR,       /* commName */                       \
  NCCL_CONFIG_UNDEF_INT,       /* collnetEnable */                  \
  NCCL_CONFIG_UNDEF_INT,       /* CTAPolicy */                      \
  NCCL_CONFIG_UNDEF_INT,       /* shrinkShare */                    \
  NCCL_CONFIG_UNDEF_INT,       /* nvlsCTAs */                       \
  NCCL_CONFIG_UNDEF_INT,       /* nChannelsPerNetPeer */            \
  NCCL_CONFIG_UNDEF_INT,       /* nvlinkCentricSched */             \
  NCCL_CONFIG_UNDEF_INT,       /* graphUsageMode */                 \
  NCCL_CONFIG_UNDEF_INT,       /* numRmaCtx */                      \
  NCCL_CONFIG_UNDEF_INT,       /* maxP2pPeers */                    \
  NCCL_CONFIG_UNDEF_INT        /* graphStreamOrdering */            \
}

/* ------------------------------------------------------------------------ */
/* Other structures                                                         */
/* ------------------------------------------------------------------------ */

/* Result of ncclGroupSimulateEnd; start from NCCL_SIM_INFO_INITIALIZER. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;     /* microseconds */
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER { \
  sizeof(ncclSimInfo_t),       /* size */          \
  0x74685283,                  /* magic */         \
  NCCL_VERSION_CODE,           /* version */       \
  NCCL_UNDEF_FLOAT             /* estimatedTime */ \
}

/* One signal to wait for in ncclWaitSignal. */
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;

/* Handle to one library parameter (ncclParamBind). */
typedef struct ncclParamHandle* ncclParamHandle_t;

/* ------------------------------------------------------------------------ */
/* Init, finalize, destroy, abort, split, shrink, grow                      */
/* ------------------------------------------------------------------------ */

/* Makes a new unique id on the calling rank; it also starts the rendezvous
 * listener in the calling process. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId);

/* Creates this rank's communicator of nranks ranks. Collective over all
 * ranks; inside ncclGroupStart/End the work is deferred to ncclGroupEnd. */
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);

/* Creates ndev communicators in one process (one per entry of devlist). */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);

/* ncclCommInitRank with a configuration (NULL: defaults). */
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config);

/* Init with nId unique ids (several rendezvous roots) for large jobs. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config);

/* Flushes outstanding work and synchronizes with peers before destroy. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);

/* Frees the communicator (finalizing it first if needed). NULL is a no-op. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);

/* Stops all work on the communicator and frees it; callable at any time. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/* Stops in-flight operations, keeping resources (revokeFlags:
 * NCCL_REVOKE_DEFAULT). */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* Collective over comm: ranks with the same color form a new communicator,
 * ordered by key; NCCL_SPLIT_NOCOLOR gives *newcomm = NULL. config NULL:
 * inherit the parent's configuration. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config);

/* Called by the surviving ranks only: a new communicator without the listed
 * ranks (shrinkFlags: NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT). */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);

/* The unique id new ranks use to join this communicator in ncclCommGrow. */
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t pncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);

/* Grows a communicator to nRanks: existing ranks pass (comm, NULL, -1), the
 * coordinator (comm, &id, -1), new ranks (NULL, &id, rank). */
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                          ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                           ncclComm_t* newcomm, ncclConfig_t* config);

/* Releases memory of an idle communicator (flags: NCCL_SUSPEND_MEM) and
 * takes it back. */
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t pncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t ncclCommResume(ncclComm_t comm);
ncclResult_t pncclCommResume(ncclComm_t comm);

/* ------------------------------------------------------------------------ */
/* Queries, errors, version                                                 */
/* ------------------------------------------------------------------------ */

/* The library's NCCL_VERSION_CODE (may differ from this header's). */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t pncclGetVersion(int* version);

/* A static description of a result code. */
const char* ncclGetErrorString(ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t result);

/* The last error message of the library (comm is unused). */
const char* ncclGetLastError(ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm);

/* Returns ncclSuccess; *asyncError receives the communicator's state
 * (ncclInProgress while a nonblocking operation is pending). */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count);

/* The CUDA device of the communicator (-1 with Shoal on host memory). */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device);

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank);

ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);
ncclResult_t pncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);

/* Re-reads the debug settings (NCCL_DEBUG...) on next use. Deprecated in
 * NCCL; kept for binaries that call it. */
void ncclResetDebugInit(void);
void pncclResetDebugInit(void);

/* ------------------------------------------------------------------------ */
/* Collectives: each returns once the operation is enqueued on stream.     */
/* In-place rules, NCCL's (all of them: docs/nccl-compat.md):               */
/* AllReduce/Reduce/Broadcast when sendbuff == recvbuff; ReduceScatter when */
/* recvbuff == sendbuff + rank*recvcount; AllGather when sendbuff ==        */
/* recvbuff + rank*sendcount.                                               */
/* ------------------------------------------------------------------------ */

/* Reduces count elements from every rank into recvbuff of rank root
 * (recvbuff may be NULL on other ranks). */
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream);

/* Legacy in-place broadcast: ncclBroadcast(buff, buff, ...). */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);

/* Copies count elements of root's sendbuff to every rank's recvbuff. */
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);

/* sendbuff holds nranks*recvcount elements; rank i receives block i. */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);

/* recvbuff holds nranks*sendcount elements; rank i's data lands at block i. */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Block j (count elements) of sendbuff goes to rank j; rank i's block lands
 * at recvbuff + i*count. Not in place. */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Rank i's count elements land at root's recvbuff + i*count. */
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* Block i (count elements) of root's sendbuff goes to rank i. */
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* ------------------------------------------------------------------------ */
/* Point-to-point and one-sided                                             */
/* ------------------------------------------------------------------------ */

/* Matches ncclRecv(peer = this rank) on rank peer, same count and type.
 * Sends and receives that must progress together go in one group. */
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* Writes localbuff into peer's window at peerWinOffset, then raises signal
 * sigIdx on the peer. */
ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype,
                           int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx,
                           int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype,
                            int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx,
                            int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                         cudaStream_t stream);

ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                            cudaStream_t stream);
ncclResult_t pncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                             cudaStream_t stream);

/* ------------------------------------------------------------------------ */
/* Groups: calls between Start and the outermost End are deferred and      */
/* issued together by that End. Nesting is allowed; the depth is per thread.*/
/* ------------------------------------------------------------------------ */

ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);

ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);

/* Ends the group as a simulation: nothing runs; simInfo->estimatedTime
 * receives the estimated time. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo);

/* ------------------------------------------------------------------------ */
/* Reduction operators                                                      */
/* ------------------------------------------------------------------------ */

/* Creates an operator computing sum over ranks of (scalar_r * x_r), valid
 * for this comm and datatype only. *scalar has type datatype. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);

/* Allowed as soon as the last call using op has returned. */
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ------------------------------------------------------------------------ */
/* Memory allocation and buffer registration                                */
/* ------------------------------------------------------------------------ */

/* Allocates memory suited to communication; works with no communicator and
 * inside a group. */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t pncclMemAlloc(void** ptr, size_t size);

ncclResult_t ncclMemFree(void* ptr);
ncclResult_t pncclMemFree(void* ptr);

/* Local registration of a buffer with a communicator. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle);

/* ------------------------------------------------------------------------ */
/* Windows (symmetric memory)                                               */
/* ------------------------------------------------------------------------ */

/* Collective; winFlags: NCCL_WIN_*; buff aligned to
 * NCCL_WIN_REQUIRED_ALIGNMENT. */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                     ncclWindow_t* win, int winFlags);

/* Local. */
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);
ncclResult_t pncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);

/* ------------------------------------------------------------------------ */
/* Parameters: read the library's settings by key (e.g. "NCCL_DEBUG").     */
/* ------------------------------------------------------------------------ */

ncclResult_t ncclParamBind(ncclParamHandle_t* out, const char* key);
ncclResult_t pncclParamBind(ncclParamHandle_t* out, const char* key);

ncclResult_t ncclParamGetI8(ncclParamHandle_t handle, int8_t* out);
ncclResult_t pncclParamGetI8(ncclParamHandle_t handle, int8_t* out);
ncclResult_t ncclParamGetI16(ncclParamHandle_t handle, int16_t* out);
ncclResult_t pncclParamGetI16(ncclParamHandle_t handle, int16_t* out);
ncclResult_t ncclParamGetI32(ncclParamHandle_t handle, int32_t* out);
ncclResult_t pncclParamGetI32(ncclParamHandle_t handle, int32_t* out);
ncclResult_t ncclParamGetI64(ncclParamHandle_t handle, int64_t* out);
ncclResult_t pncclParamGetI64(ncclParamHandle_t handle, int64_t* out);
ncclResult_t ncclParamGetU8(ncclParamHandle_t handle, uint8_t* out);
ncclResult_t pncclParamGetU8(ncclParamHandle_t handle, uint8_t* out);
ncclResult_t ncclParamGetU16(ncclParamHandle_t handle, uint16_t* out);
ncclResult_t pncclParamGetU16(ncclParamHandle_t handle, uint16_t* out);
ncclResult_t ncclParamGetU32(ncclParamHandle_t handle, uint32_t* out);
ncclResult_t pncclParamGetU32(ncclParamHandle_t handle, uint32_t* out);
ncclResult_t ncclParamGetU64(ncclParamHandle_t handle, uint64_t* out);
ncclResult_t pncclParamGetU64(ncclParamHandle_t handle, uint64_t* out);

ncclResult_t ncclParamGetStr(ncclParamHandle_t handle, const char** out);
ncclResult_t pncclParamGetStr(ncclParamHandle_t handle, const char** out);

/* Copies the raw value (at most maxLen bytes) to out; *len: its size. */
ncclResult_t ncclParamGet(ncclParamHandle_t handle, void* out, int maxLen, int* len);
ncclResult_t pncclParamGet(ncclParamHandle_t handle, void* out, int maxLen, int* len);

ncclResult_t ncclParamGetParameter(const char* key, const char** value, int* valueLen);
ncclResult_t pncclParamGetParameter(const char* key, const char** value, int* valueLen);

ncclResult_t ncclParamGetAllParameterKeys(const char*** table, int* tableLen);
ncclResult_t pncclParamGetAllParameterKeys(const char*** table, int* tableLen);

/* Prints every parameter and its value. */
void ncclParamDumpAll(void);
void pncclParamDumpAll(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
