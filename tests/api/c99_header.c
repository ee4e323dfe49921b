/*
 * c99_header.c -- nccl.h must compile as strict C99 and link against
 * libnccl.so.2 with every symbol it declares.
 *
 * Role: build-time ABI test (CTest label "api"). Compilation checks the type
 * layouts and enum values of NCCL 2.30.7 with static assertions, and the
 * exact signature of every host function of its nccl.h by assigning ncclX
 * and pncclX to pointers of the expected type. Linking checks that the
 * library exports all of them. At run time it calls only what needs
 * no communicator: ncclGetVersion and ncclGetErrorString.
 */
#include <nccl.h>

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* _Static_assert is C11; GCC and Clang accept it in C99 as an extension,
 * which __extension__ keeps quiet under -pedantic. */
#if defined(__GNUC__)
#define STATIC_CHECK(cond, msg) __extension__ _Static_assert(cond, msg)
#else
#define STATIC_CHECK(cond, msg) _Static_assert(cond, msg)
#endif

/* ---- Layouts (LP64) ---------------------------------------------------- */

STATIC_CHECK(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
STATIC_CHECK(NCCL_UNIQUE_ID_BYTES == 128, "NCCL_UNIQUE_ID_BYTES");
STATIC_CHECK(sizeof(ncclConfig_t) == 96, "ncclConfig_t is 96 bytes (2.30.7)");
STATIC_CHECK(offsetof(ncclConfig_t, size) == 0, "size");
STATIC_CHECK(offsetof(ncclConfig_t, magic) == 8, "magic");
STATIC_CHECK(offsetof(ncclConfig_t, version) == 12, "version");
STATIC_CHECK(offsetof(ncclConfig_t, blocking) == 16, "blocking");
STATIC_CHECK(offsetof(ncclConfig_t, cgaClusterSize) == 20, "cgaClusterSize");
STATIC_CHECK(offsetof(ncclConfig_t, minCTAs) == 24, "minCTAs");
STATIC_CHECK(offsetof(ncclConfig_t, maxCTAs) == 28, "maxCTAs");
STATIC_CHECK(offsetof(ncclConfig_t, netName) == 32, "netName");
STATIC_CHECK(offsetof(ncclConfig_t, splitShare) == 40, "splitShare");
STATIC_CHECK(offsetof(ncclConfig_t, trafficClass) == 44, "trafficClass");
STATIC_CHECK(offsetof(ncclConfig_t, commName) == 48, "commName");
STATIC_CHECK(offsetof(ncclConfig_t, collnetEnable) == 56, "collnetEnable");
STATIC_CHECK(offsetof(ncclConfig_t, CTAPolicy) == 60, "CTAPolicy");
STATIC_CHECK(offsetof(ncclConfig_t, shrinkShare) == 64, "shrinkShare");
STATIC_CHECK(offsetof(ncclConfig_t, nvlsCTAs) == 68, "nvlsCTAs");
STATIC_CHECK(offsetof(ncclConfig_t, nChannelsPerNetPeer) == 72, "nChannelsPerNetPeer");
STATIC_CHECK(offsetof(ncclConfig_t, nvlinkCentricSched) == 76, "nvlinkCentricSched");
STATIC_CHECK(offsetof(ncclConfig_t, graphUsageMode) == 80, "graphUsageMode");
STATIC_CHECK(offsetof(ncclConfig_t, numRmaCtx) == 84, "numRmaCtx");
STATIC_CHECK(offsetof(ncclConfig_t, maxP2pPeers) == 88, "maxP2pPeers");
STATIC_CHECK(offsetof(ncclConfig_t, graphStreamOrdering) == 92, "graphStreamOrdering");
STATIC_CHECK(sizeof(ncclSimInfo_t) == 24, "ncclSimInfo_t is 24 bytes");
STATIC_CHECK(offsetof(ncclSimInfo_t, estimatedTime) == 16, "estimatedTime");
STATIC_CHECK(sizeof(ncclWaitSignalDesc_t) == 16, "ncclWaitSignalDesc_t");
STATIC_CHECK(offsetof(ncclWaitSignalDesc_t, ctx) == 12, "ncclWaitSignalDesc_t.ctx");
STATIC_CHECK(sizeof(ncclResult_t) == 4, "ncclResult_t is 4 bytes");
STATIC_CHECK(sizeof(ncclRedOp_t) == 4, "ncclRedOp_t is 4 bytes");
STATIC_CHECK(sizeof(ncclDataType_t) == 4, "ncclDataType_t is 4 bytes");

/* ---- Enum values ------------------------------------------------------- */

STATIC_CHECK(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2 &&
                 ncclInternalError == 3 && ncclInvalidArgument == 4 && ncclInvalidUsage == 5 &&
                 ncclRemoteError == 6 && ncclInProgress == 7 && ncclTimeout == 8 &&
                 ncclNumResults == 9,
             "ncclResult_t values");
STATIC_CHECK(ncclInt8 == 0 && ncclChar == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclInt == 2 &&
                 ncclUint32 == 3 && ncclInt64 == 4 && ncclUint64 == 5 && ncclFloat16 == 6 &&
                 ncclHalf == 6 && ncclFloat32 == 7 && ncclFloat == 7 && ncclFloat64 == 8 &&
                 ncclDouble == 8 && ncclBfloat16 == 9 && ncclFloat8e4m3 == 10 &&
                 ncclFloat8e5m2 == 11 && ncclNumTypes == 12,
             "ncclDataType_t values");
STATIC_CHECK(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4 &&
                 ncclNumOps == 5 && ncclMaxRedOp == 0x7fffffff,
             "ncclRedOp_t values");
STATIC_CHECK(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1, "ncclScalarResidence_t");
STATIC_CHECK(ncclStatGpuMemSuspend == 0 && ncclStatGpuMemSuspended == 1 &&
                 ncclStatGpuMemPersist == 2 && ncclStatGpuMemTotal == 3,
             "ncclCommMemStat_t");

/* ---- Constants --------------------------------------------------------- */

STATIC_CHECK(NCCL_MAJOR == 2 && NCCL_MINOR == 30 && NCCL_PATCH == 7, "version macros");
STATIC_CHECK(NCCL_VERSION_CODE == 23007, "NCCL_VERSION_CODE");
STATIC_CHECK(NCCL_VERSION(2, 30, 7) == 23007, "NCCL_VERSION, new encoding");
STATIC_CHECK(NCCL_VERSION(2, 8, 4) == 2804, "NCCL_VERSION, old encoding");
STATIC_CHECK(NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) == NCCL_VERSION_CODE, "consistent");
STATIC_CHECK(NCCL_CONFIG_UNDEF_INT == INT_MIN, "NCCL_CONFIG_UNDEF_INT");
STATIC_CHECK(NCCL_SPLIT_NOCOLOR == -1, "NCCL_SPLIT_NOCOLOR");
STATIC_CHECK(NCCL_API_MAGIC == 0xcafebeef, "NCCL_API_MAGIC");
STATIC_CHECK(NCCL_CTA_POLICY_DEFAULT == 0 && NCCL_CTA_POLICY_EFFICIENCY == 1 &&
                 NCCL_CTA_POLICY_ZERO == 2,
             "CTA policy");
STATIC_CHECK(NCCL_SHRINK_DEFAULT == 0 && NCCL_SHRINK_ABORT == 1 && NCCL_REVOKE_DEFAULT == 0,
             "shrink/revoke flags");
STATIC_CHECK(NCCL_SUSPEND_MEM == 1, "NCCL_SUSPEND_MEM");
STATIC_CHECK(NCCL_WIN_DEFAULT == 0 && NCCL_WIN_COLL_SYMMETRIC == 1 &&
                 NCCL_WIN_STRICT_ORDERING == 2 && NCCL_WIN_REQUIRED_ALIGNMENT == 4096,
             "window flags");

/* ---- Every function, by exact signature --------------------------------
 * Each line makes two external pointers of the expected type, initialized
 * with ncclX and pncclX: a wrong signature fails to compile (incompatible
 * pointer types are an error under -Werror), a missing export fails to link. */
#define EXPECT_API(ret, name, params)     \
  ret(*const expect_##name) params = name; \
  ret(*const expect_p##name) params = p##name;

/* init / finalize / destroy / abort / split / shrink / grow */
EXPECT_API(ncclResult_t, ncclGetUniqueId, (ncclUniqueId*))
EXPECT_API(ncclResult_t, ncclCommInitRank, (ncclComm_t*, int, ncclUniqueId, int))
EXPECT_API(ncclResult_t, ncclCommInitAll, (ncclComm_t*, int, const int*))
EXPECT_API(ncclResult_t, ncclCommInitRankConfig,
           (ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*))
EXPECT_API(ncclResult_t, ncclCommInitRankScalable,
           (ncclComm_t*, int, int, int, ncclUniqueId*, ncclConfig_t*))
EXPECT_API(ncclResult_t, ncclCommFinalize, (ncclComm_t))
EXPECT_API(ncclResult_t, ncclCommDestroy, (ncclComm_t))
EXPECT_API(ncclResult_t, ncclCommAbort, (ncclComm_t))
EXPECT_API(ncclResult_t, ncclCommRevoke, (ncclComm_t, int))
EXPECT_API(ncclResult_t, ncclCommSplit, (ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*))
EXPECT_API(ncclResult_t, ncclCommShrink,
           (ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int))
EXPECT_API(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t, ncclUniqueId*))
EXPECT_API(ncclResult_t, ncclCommGrow,
           (ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*, ncclConfig_t*))
EXPECT_API(ncclResult_t, ncclCommSuspend, (ncclComm_t, int))
EXPECT_API(ncclResult_t, ncclCommResume, (ncclComm_t))

/* query / errors / version */
EXPECT_API(ncclResult_t, ncclGetVersion, (int*))
EXPECT_API(const char*, ncclGetErrorString, (ncclResult_t))
EXPECT_API(const char*, ncclGetLastError, (ncclComm_t))
EXPECT_API(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t, ncclResult_t*))
EXPECT_API(ncclResult_t, ncclCommCount, (const ncclComm_t, int*))
EXPECT_API(ncclResult_t, ncclCommCuDevice, (const ncclComm_t, int*))
EXPECT_API(ncclResult_t, ncclCommUserRank, (const ncclComm_t, int*))
EXPECT_API(ncclResult_t, ncclCommMemStats, (ncclComm_t, ncclCommMemStat_t, uint64_t*))
EXPECT_API(void, ncclResetDebugInit, (void))

/* collectives */
EXPECT_API(ncclResult_t, ncclReduce,
           (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
            cudaStream_t))
EXPECT_API(ncclResult_t, ncclBcast,
           (void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
EXPECT_API(ncclResult_t, ncclBroadcast,
           (const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
EXPECT_API(ncclResult_t, ncclAllReduce,
           (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))
EXPECT_API(ncclResult_t, ncclReduceScatter,
           (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))
EXPECT_API(ncclResult_t, ncclAllGather,
           (const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t))
EXPECT_API(ncclResult_t, ncclAlltoAll,
           (const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t))
EXPECT_API(ncclResult_t, ncclGather,
           (const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
EXPECT_API(ncclResult_t, ncclScatter,
           (const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))

/* point-to-point and one-sided */
EXPECT_API(ncclResult_t, ncclSend,
           (const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
EXPECT_API(ncclResult_t, ncclRecv, (void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))
EXPECT_API(ncclResult_t, ncclPutSignal,
           (const void*, size_t, ncclDataType_t, int, ncclWindow_t, size_t, int, int,
            unsigned int, ncclComm_t, cudaStream_t))
EXPECT_API(ncclResult_t, ncclSignal, (int, int, int, unsigned int, ncclComm_t, cudaStream_t))
EXPECT_API(ncclResult_t, ncclWaitSignal,
           (int, ncclWaitSignalDesc_t*, ncclComm_t, cudaStream_t))

/* groups */
EXPECT_API(ncclResult_t, ncclGroupStart, (void))
EXPECT_API(ncclResult_t, ncclGroupEnd, (void))
EXPECT_API(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t*))

/* reduction operators */
EXPECT_API(ncclResult_t, ncclRedOpCreatePreMulSum,
           (ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t))
EXPECT_API(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t, ncclComm_t))

/* memory and registration */
EXPECT_API(ncclResult_t, ncclMemAlloc, (void**, size_t))
EXPECT_API(ncclResult_t, ncclMemFree, (void*))
EXPECT_API(ncclResult_t, ncclCommRegister, (const ncclComm_t, void*, size_t, void**))
EXPECT_API(ncclResult_t, ncclCommDeregister, (const ncclComm_t, void*))

/* windows */
EXPECT_API(ncclResult_t, ncclCommWindowRegister, (ncclComm_t, void*, size_t, ncclWindow_t*, int))
EXPECT_API(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t, ncclWindow_t))
EXPECT_API(ncclResult_t, ncclWinGetUserPtr, (ncclComm_t, ncclWindow_t, void**))

/* parameters */
EXPECT_API(ncclResult_t, ncclParamBind, (ncclParamHandle_t*, const char*))
EXPECT_API(ncclResult_t, ncclParamGetI8, (ncclParamHandle_t, int8_t*))
EXPECT_API(ncclResult_t, ncclParamGetI16, (ncclParamHandle_t, int16_t*))
EXPECT_API(ncclResult_t, ncclParamGetI32, (ncclParamHandle_t, int32_t*))
EXPECT_API(ncclResult_t, ncclParamGetI64, (ncclParamHandle_t, int64_t*))
EXPECT_API(ncclResult_t, ncclParamGetU8, (ncclParamHandle_t, uint8_t*))
EXPECT_API(ncclResult_t, ncclParamGetU16, (ncclParamHandle_t, uint16_t*))
EXPECT_API(ncclResult_t, ncclParamGetU32, (ncclParamHandle_t, uint32_t*))
EXPECT_API(ncclResult_t, ncclParamGetU64, (ncclParamHandle_t, uint64_t*))
EXPECT_API(ncclResult_t, ncclParamGetStr, (ncclParamHandle_t, const char**))
EXPECT_API(ncclResult_t, ncclParamGet, (ncclParamHandle_t, void*, int, int*))
EXPECT_API(ncclResult_t, ncclParamGetParameter, (const char*, const char**, int*))
EXPECT_API(ncclResult_t, ncclParamGetAllParameterKeys, (const char***, int*))
EXPECT_API(void, ncclParamDumpAll, (void))

/* ---- Every type and initializer, used as C code uses them -------------- */

static int uses_every_type(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t simInfo = NCCL_SIM_INFO_INITIALIZER;
  ncclUniqueId id;
  ncclComm_t comm = NCCL_COMM_NULL;
  ncclWindow_t window = NULL;
  ncclParamHandle_t param = NULL;
  ncclWaitSignalDesc_t signal = {0, 1, 2, 3};
  ncclResult_t result = ncclSuccess;
  ncclRedOp_t op = ncclSum;
  ncclRedOp_dummy_t dummy = ncclNumOps_dummy;
  ncclDataType_t type = ncclFloat;
  ncclScalarResidence_t residence = ncclScalarHostImmediate;
  ncclCommMemStat_t stat = ncclStatGpuMemTotal;
  cudaStream_t stream = (cudaStream_t)0;
  int bad = 0;

  memset(&id, 0, sizeof id);
  config.blocking = 0;
  config.netName = NCCL_CONFIG_UNDEF_PTR;
  config.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
  config.graphStreamOrdering = 1;

  bad += config.size != sizeof(ncclConfig_t);
  bad += config.magic != NCCL_API_MAGIC;
  bad += config.version != NCCL_VERSION_CODE;
  bad += config.cgaClusterSize != NCCL_CONFIG_UNDEF_INT;
  bad += config.maxP2pPeers != NCCL_CONFIG_UNDEF_INT;
  bad += config.commName != NULL;
  bad += simInfo.size != sizeof(ncclSimInfo_t);
  bad += simInfo.magic != 0x74685283u;
  bad += simInfo.version != NCCL_VERSION_CODE;
  bad += simInfo.estimatedTime != NCCL_UNDEF_FLOAT;
  bad += comm != NULL || window != NULL || param != NULL || stream != NULL;
  bad += signal.opCnt + signal.peer + signal.sigIdx + signal.ctx != 6;
  bad += result != ncclSuccess || op != ncclSum || dummy != 5 || type != ncclFloat32;
  bad += residence != 1 || stat != 3;
  bad += id.internal[NCCL_UNIQUE_ID_BYTES - 1] != 0;
  bad += strlen(NCCL_SUFFIX) != 0;
  return bad;
}

/* ---- Run time: only calls that need no communicator -------------------- */

static int check_error_string(ncclResult_t result, const char* expected) {
  const char* actual = ncclGetErrorString(result);
  if (actual == NULL || strcmp(actual, expected) != 0) {
    fprintf(stderr, "ncclGetErrorString(%d) = \"%s\", expected \"%s\"\n", (int)result,
            actual ? actual : "(null)", expected);
    return 1;
  }
  return 0;
}

int main(void) {
  int failures = uses_every_type();
  int version = 0;

  if (failures) fprintf(stderr, "initializers or types hold unexpected values\n");

  if (ncclGetVersion(&version) != ncclSuccess || version != 23007) {
    fprintf(stderr, "ncclGetVersion gave %d, expected 23007\n", version);
    failures++;
  }

  failures += check_error_string(ncclSuccess, "no error");
  failures += check_error_string(ncclUnhandledCudaError,
                                 "unhandled cuda error (run with NCCL_DEBUG=INFO for details)");
  failures += check_error_string(ncclSystemError,
                                 "unhandled system error (run with NCCL_DEBUG=INFO for details)");
  failures += check_error_string(ncclInternalError,
                                 "internal error - please report this issue to the NCCL developers");
  failures += check_error_string(ncclInvalidArgument,
                                 "invalid argument (run with NCCL_DEBUG=WARN for details)");
  failures += check_error_string(ncclInvalidUsage,
                                 "invalid usage (run with NCCL_DEBUG=WARN for details)");
  failures += check_error_string(ncclRemoteError,
                                 "remote process exited or there was a network error");
  failures += check_error_string(ncclInProgress, "NCCL operation in progress");
  failures += check_error_string(ncclTimeout, "timeout");
  failures += check_error_string(ncclNumResults, "unknown result code");

  if (expect_ncclGetVersion != ncclGetVersion || expect_pncclGetVersion == NULL) failures++;

  if (failures == 0) printf("c99_header: OK\n");
  return failures == 0 ? 0 : 1;
}
