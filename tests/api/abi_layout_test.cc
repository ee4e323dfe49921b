// ABI layout of nccl.h as seen from C++: NCCL 2.30.7's version macros, types,
// enum values, ncclConfig_t layout (LP64) and function signatures.
//
// Role: CTest label "api". The same facts as c99_header.c, checked by a C++
// compiler: struct sizes and field offsets, enum values, version macros,
// initializers, and that every ncclX has exactly the type of its pncclX twin.
// Most checks are static_asserts (a failure stops the build); the TEST_CASEs
// repeat the key ones at run time so that the report names them.
#include <nccl.h>

#include <catch2/catch.hpp>

#include <climits>
#include <cstddef>
#include <cstring>
#include <type_traits>

namespace {

// ---- Layouts (LP64) --------------------------------------------------------

static_assert(sizeof(ncclUniqueId) == 128);
static_assert(sizeof(ncclConfig_t) == 96);
static_assert(std::is_standard_layout_v<ncclConfig_t> && std::is_trivially_copyable_v<ncclConfig_t>);
static_assert(std::is_same_v<decltype(ncclConfig_t::size), size_t>);
static_assert(std::is_same_v<decltype(ncclConfig_t::magic), unsigned int>);
static_assert(std::is_same_v<decltype(ncclConfig_t::version), unsigned int>);
static_assert(std::is_same_v<decltype(ncclConfig_t::netName), const char*>);
static_assert(std::is_same_v<decltype(ncclConfig_t::commName), const char*>);
static_assert(std::is_same_v<decltype(ncclConfig_t::graphStreamOrdering), int>);
static_assert(sizeof(ncclSimInfo_t) == 24);
static_assert(sizeof(ncclWaitSignalDesc_t) == 16);
static_assert(sizeof(ncclResult_t) == 4 && sizeof(ncclRedOp_t) == 4 && sizeof(ncclDataType_t) == 4);

struct FieldOffset {
  const char* name;
  size_t actual;
  size_t expected;
};

// NCCL 2.30.7's ncclConfig_t (struct ncclConfig_v23000, 96 bytes), in
// declaration order.
constexpr FieldOffset kConfigOffsets[] = {
    {"size", offsetof(ncclConfig_t, size), 0},
    {"magic", offsetof(ncclConfig_t, magic), 8},
    {"version", offsetof(ncclConfig_t, version), 12},
    {"blocking", offsetof(ncclConfig_t, blocking), 16},
    {"cgaClusterSize", offsetof(ncclConfig_t, cgaClusterSize), 20},
    {"minCTAs", offsetof(ncclConfig_t, minCTAs), 24},
    {"maxCTAs", offsetof(ncclConfig_t, maxCTAs), 28},
    {"netName", offsetof(ncclConfig_t, netName), 32},
    {"splitShare", offsetof(ncclConfig_t, splitShare), 40},
    {"trafficClass", offsetof(ncclConfig_t, trafficClass), 44},
    {"commName", offsetof(ncclConfig_t, commName), 48},
    {"collnetEnable", offsetof(ncclConfig_t, collnetEnable), 56},
    {"CTAPolicy", offsetof(ncclConfig_t, CTAPolicy), 60},
    {"shrinkShare", offsetof(ncclConfig_t, shrinkShare), 64},
    {"nvlsCTAs", offsetof(ncclConfig_t, nvlsCTAs), 68},
    {"nChannelsPerNetPeer", offsetof(ncclConfig_t, nChannelsPerNetPeer), 72},
    {"nvlinkCentricSched", offsetof(ncclConfig_t, nvlinkCentricSched), 76},
    {"graphUsageMode", offsetof(ncclConfig_t, graphUsageMode), 80},
    {"numRmaCtx", offsetof(ncclConfig_t, numRmaCtx), 84},
    {"maxP2pPeers", offsetof(ncclConfig_t, maxP2pPeers), 88},
    {"graphStreamOrdering", offsetof(ncclConfig_t, graphStreamOrdering), 92},
};

constexpr bool allOffsetsMatch() {
  for (const FieldOffset& field : kConfigOffsets) {
    if (field.actual != field.expected) return false;
  }
  return true;
}
static_assert(allOffsetsMatch(), "ncclConfig_t field offsets differ from NCCL 2.30.7");

// ---- Enum values -------------------------------------------------------------

static_assert(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2 &&
              ncclInternalError == 3 && ncclInvalidArgument == 4 && ncclInvalidUsage == 5 &&
              ncclRemoteError == 6 && ncclInProgress == 7 && ncclTimeout == 8 &&
              ncclNumResults == 9);
static_assert(ncclInt8 == 0 && ncclChar == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclInt == 2 &&
              ncclUint32 == 3 && ncclInt64 == 4 && ncclUint64 == 5 && ncclFloat16 == 6 &&
              ncclHalf == 6 && ncclFloat32 == 7 && ncclFloat == 7 && ncclFloat64 == 8 &&
              ncclDouble == 8 && ncclBfloat16 == 9 && ncclFloat8e4m3 == 10 &&
              ncclFloat8e5m2 == 11 && ncclNumTypes == 12);
static_assert(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4 &&
              ncclNumOps == 5 && ncclMaxRedOp == 0x7fffffff && ncclNumOps_dummy == 5);
static_assert(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1);
static_assert(ncclStatGpuMemSuspend == 0 && ncclStatGpuMemSuspended == 1 &&
              ncclStatGpuMemPersist == 2 && ncclStatGpuMemTotal == 3);

// ---- Version and constants -----------------------------------------------------

static_assert(NCCL_MAJOR == 2 && NCCL_MINOR == 30 && NCCL_PATCH == 7);
static_assert(NCCL_VERSION_CODE == 23007);
static_assert(NCCL_VERSION(2, 30, 7) == 23007);
static_assert(NCCL_VERSION(2, 8, 4) == 2804);
static_assert(NCCL_VERSION(2, 9, 6) == 20906);
static_assert(NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) == NCCL_VERSION_CODE);
static_assert(NCCL_UNIQUE_ID_BYTES == 128);
static_assert(NCCL_CONFIG_UNDEF_INT == INT_MIN);
static_assert(NCCL_SPLIT_NOCOLOR == -1);
static_assert(NCCL_API_MAGIC == 0xcafebeef);
static_assert(NCCL_CTA_POLICY_DEFAULT == 0 && NCCL_CTA_POLICY_EFFICIENCY == 1 &&
              NCCL_CTA_POLICY_ZERO == 2);
static_assert(NCCL_SHRINK_DEFAULT == 0 && NCCL_SHRINK_ABORT == 1 && NCCL_REVOKE_DEFAULT == 0);
static_assert(NCCL_SUSPEND_MEM == 1);
static_assert(NCCL_WIN_DEFAULT == 0 && NCCL_WIN_COLL_SYMMETRIC == 1 &&
              NCCL_WIN_STRICT_ORDERING == 2 && NCCL_WIN_REQUIRED_ALIGNMENT == 4096);

// ---- Every ncclX has its pncclX twin with the same type, NCCL 2.30.7's ----

#define EXPECT_API(name, type)                                   \
  static_assert(std::is_same_v<decltype(&name), type>, #name);   \
  static_assert(std::is_same_v<decltype(&p##name), type>, "p" #name);

using Stream = cudaStream_t;
EXPECT_API(ncclGetUniqueId, ncclResult_t (*)(ncclUniqueId*))
EXPECT_API(ncclCommInitRank, ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int))
EXPECT_API(ncclCommInitAll, ncclResult_t (*)(ncclComm_t*, int, const int*))
EXPECT_API(ncclCommInitRankConfig,
           ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*))
EXPECT_API(ncclCommInitRankScalable,
           ncclResult_t (*)(ncclComm_t*, int, int, int, ncclUniqueId*, ncclConfig_t*))
EXPECT_API(ncclCommFinalize, ncclResult_t (*)(ncclComm_t))
EXPECT_API(ncclCommDestroy, ncclResult_t (*)(ncclComm_t))
EXPECT_API(ncclCommAbort, ncclResult_t (*)(ncclComm_t))
EXPECT_API(ncclCommRevoke, ncclResult_t (*)(ncclComm_t, int))
EXPECT_API(ncclCommSplit, ncclResult_t (*)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*))
EXPECT_API(ncclCommShrink, ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int))
EXPECT_API(ncclCommGetUniqueId, ncclResult_t (*)(ncclComm_t, ncclUniqueId*))
EXPECT_API(ncclCommGrow,
           ncclResult_t (*)(ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*, ncclConfig_t*))
EXPECT_API(ncclCommSuspend, ncclResult_t (*)(ncclComm_t, int))
EXPECT_API(ncclCommResume, ncclResult_t (*)(ncclComm_t))
EXPECT_API(ncclGetVersion, ncclResult_t (*)(int*))
EXPECT_API(ncclGetErrorString, const char* (*)(ncclResult_t))
EXPECT_API(ncclGetLastError, const char* (*)(ncclComm_t))
EXPECT_API(ncclCommGetAsyncError, ncclResult_t (*)(ncclComm_t, ncclResult_t*))
EXPECT_API(ncclCommCount, ncclResult_t (*)(const ncclComm_t, int*))
EXPECT_API(ncclCommCuDevice, ncclResult_t (*)(const ncclComm_t, int*))
EXPECT_API(ncclCommUserRank, ncclResult_t (*)(const ncclComm_t, int*))
EXPECT_API(ncclCommMemStats, ncclResult_t (*)(ncclComm_t, ncclCommMemStat_t, uint64_t*))
EXPECT_API(ncclResetDebugInit, void (*)())
EXPECT_API(ncclReduce, ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                        int, ncclComm_t, Stream))
EXPECT_API(ncclBcast, ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, Stream))
EXPECT_API(ncclBroadcast,
           ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, Stream))
EXPECT_API(ncclAllReduce, ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t,
                                           ncclRedOp_t, ncclComm_t, Stream))
EXPECT_API(ncclReduceScatter, ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t,
                                               ncclRedOp_t, ncclComm_t, Stream))
EXPECT_API(ncclAllGather,
           ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, Stream))
EXPECT_API(ncclAlltoAll,
           ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, Stream))
EXPECT_API(ncclGather,
           ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, Stream))
EXPECT_API(ncclScatter,
           ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, Stream))
EXPECT_API(ncclSend,
           ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclComm_t, Stream))
EXPECT_API(ncclRecv, ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, Stream))
EXPECT_API(ncclPutSignal,
           ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclWindow_t, size_t, int,
                            int, unsigned int, ncclComm_t, Stream))
EXPECT_API(ncclSignal, ncclResult_t (*)(int, int, int, unsigned int, ncclComm_t, Stream))
EXPECT_API(ncclWaitSignal, ncclResult_t (*)(int, ncclWaitSignalDesc_t*, ncclComm_t, Stream))
EXPECT_API(ncclGroupStart, ncclResult_t (*)())
EXPECT_API(ncclGroupEnd, ncclResult_t (*)())
EXPECT_API(ncclGroupSimulateEnd, ncclResult_t (*)(ncclSimInfo_t*))
EXPECT_API(ncclRedOpCreatePreMulSum,
           ncclResult_t (*)(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t))
EXPECT_API(ncclRedOpDestroy, ncclResult_t (*)(ncclRedOp_t, ncclComm_t))
EXPECT_API(ncclMemAlloc, ncclResult_t (*)(void**, size_t))
EXPECT_API(ncclMemFree, ncclResult_t (*)(void*))
EXPECT_API(ncclCommRegister, ncclResult_t (*)(const ncclComm_t, void*, size_t, void**))
EXPECT_API(ncclCommDeregister, ncclResult_t (*)(const ncclComm_t, void*))
EXPECT_API(ncclCommWindowRegister, ncclResult_t (*)(ncclComm_t, void*, size_t, ncclWindow_t*, int))
EXPECT_API(ncclCommWindowDeregister, ncclResult_t (*)(ncclComm_t, ncclWindow_t))
EXPECT_API(ncclWinGetUserPtr, ncclResult_t (*)(ncclComm_t, ncclWindow_t, void**))
EXPECT_API(ncclParamBind, ncclResult_t (*)(ncclParamHandle_t*, const char*))
EXPECT_API(ncclParamGetI8, ncclResult_t (*)(ncclParamHandle_t, int8_t*))
EXPECT_API(ncclParamGetI16, ncclResult_t (*)(ncclParamHandle_t, int16_t*))
EXPECT_API(ncclParamGetI32, ncclResult_t (*)(ncclParamHandle_t, int32_t*))
EXPECT_API(ncclParamGetI64, ncclResult_t (*)(ncclParamHandle_t, int64_t*))
EXPECT_API(ncclParamGetU8, ncclResult_t (*)(ncclParamHandle_t, uint8_t*))
EXPECT_API(ncclParamGetU16, ncclResult_t (*)(ncclParamHandle_t, uint16_t*))
EXPECT_API(ncclParamGetU32, ncclResult_t (*)(ncclParamHandle_t, uint32_t*))
EXPECT_API(ncclParamGetU64, ncclResult_t (*)(ncclParamHandle_t, uint64_t*))
EXPECT_API(ncclParamGetStr, ncclResult_t (*)(ncclParamHandle_t, const char**))
EXPECT_API(ncclParamGet, ncclResult_t (*)(ncclParamHandle_t, void*, int, int*))
EXPECT_API(ncclParamGetParameter, ncclResult_t (*)(const char*, const char**, int*))
EXPECT_API(ncclParamGetAllParameterKeys, ncclResult_t (*)(const char***, int*))
EXPECT_API(ncclParamDumpAll, void (*)())

#undef EXPECT_API

// The handles are opaque pointers, and CUDA's stream type is the same pointer
// type whether or not CUDA's headers were found.
static_assert(std::is_same_v<ncclComm_t, ncclComm*>);
static_assert(std::is_same_v<ncclWindow_t, ncclWindow_vidmem*>);
static_assert(std::is_same_v<ncclParamHandle_t, ncclParamHandle*>);
static_assert(std::is_same_v<cudaStream_t, CUstream_st*>);

}  // namespace

TEST_CASE("ncclConfig_t has NCCL 2.30.7's size and field offsets", "[api][abi]") {
  CHECK(sizeof(ncclConfig_t) == 96);
  for (const FieldOffset& field : kConfigOffsets) {
    INFO("field " << field.name);
    CHECK(field.actual == field.expected);
  }
}

TEST_CASE("NCCL_CONFIG_INITIALIZER stamps size / magic and version and leaves the rest undefined",
          "[api][abi]") {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  CHECK(config.size == sizeof(ncclConfig_t));
  CHECK(config.magic == 0xcafebeefu);
  CHECK(config.version == 23007u);
  const int undefinedInts[] = {config.blocking,      config.cgaClusterSize,   config.minCTAs,
                               config.maxCTAs,       config.splitShare,       config.trafficClass,
                               config.collnetEnable, config.CTAPolicy,        config.shrinkShare,
                               config.nvlsCTAs,      config.nChannelsPerNetPeer,
                               config.nvlinkCentricSched, config.graphUsageMode, config.numRmaCtx,
                               config.maxP2pPeers,   config.graphStreamOrdering};
  for (int value : undefinedInts) CHECK(value == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.netName == nullptr);
  CHECK(config.commName == nullptr);
}

TEST_CASE("NCCL_SIM_INFO_INITIALIZER matches NCCL's", "[api][abi]") {
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  CHECK(info.size == 24);
  CHECK(info.magic == 0x74685283u);
  CHECK(info.version == 23007u);
  CHECK(info.estimatedTime == NCCL_UNDEF_FLOAT);
}

TEST_CASE("ncclUniqueId is 128 opaque bytes passed by value", "[api][abi]") {
  ncclUniqueId id;
  std::memset(&id, 0x5a, sizeof id);
  CHECK(sizeof id.internal == NCCL_UNIQUE_ID_BYTES);
  ncclUniqueId copy = id;
  CHECK(std::memcmp(&copy, &id, sizeof id) == 0);
}

TEST_CASE("Version macros encode both NCCL version schemes", "[api][abi]") {
  CHECK(NCCL_VERSION(2, 30, 7) == 23007);
  CHECK(NCCL_VERSION(2, 8, 4) == 2804);
  CHECK(NCCL_VERSION_CODE == 23007);
  CHECK(std::strcmp(NCCL_SUFFIX, "") == 0);
}
