// The device reduction kernels through Shoal's loader and launch helper
// (cuda::DeviceReducer), on the driver stand-in: the fatbin nvcc built is
// loaded with every kernel resolved at once; each of the 12 types x 6
// operators, launched on device buffers through the driver API, equals the
// host reducer bit for bit (edge values, every pair of fp8 codes, in place,
// odd counts and offsets); premulsum reads a device scalar when the kernel
// runs; a kernel missing from the image fails the load naming it; bad
// arguments are refused with the reason; a device communicator's first use
// loads the kernels, and later collectives load nothing.
//
// The stand-in runs each kernel with src/reduce/element_ops.h's element
// functions compiled for the host (tests/cudafake/README.md); what only a GPU
// can prove (the compiled kernels' own results, their speed) is listed in
// docs/cuda.md.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <nccl.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/device_reducer.h"
#include "cuda/driver.h"
#include "cudafake/fake_cuda.h"
#include "reduce/reduce.h"
#include "transports/loopback/loopback_transport.h"

namespace shoal::cuda {

// The embedded fatbin (src/cuda/device_reducer.cc declares it for the loader).
const unsigned char* reduceKernelsImage();

namespace {

// The library loads the stand-in this binary links.
const bool kDriverNamed = setenv("SHOAL_CUDA_DRIVER", SHOAL_CUDAFAKE_LIB, 0) == 0;

#define CU_OK(call) REQUIRE((call) == CUDA_SUCCESS)

const DataType kAllTypes[] = {
    DataType::kInt8,    DataType::kUint8,    DataType::kInt32,      DataType::kUint32,
    DataType::kInt64,   DataType::kUint64,   DataType::kFloat16,    DataType::kFloat32,
    DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};
const ElementOp kAllOps[] = {ElementOp::kSum, ElementOp::kProd,      ElementOp::kMax,
                             ElementOp::kMin, ElementOp::kPreMulSum, ElementOp::kAvg};
constexpr int kAvgRanks = 3;

Driver& driverOnDevice0() {
  REQUIRE(kDriverNamed);
  CU_OK(cuInit(0));
  CUcontext ctx = nullptr;
  CU_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
  CU_OK(cuCtxSetCurrent(ctx));
  Driver* driver = Driver::inUse();
  REQUIRE(driver != nullptr);
  return *driver;
}

// Device memory of `bytes` (at least 1), freed at scope end.
struct DeviceBytes {
  CUdeviceptr ptr = 0;
  explicit DeviceBytes(size_t bytes) { CU_OK(cuMemAlloc(&ptr, bytes == 0 ? 1 : bytes)); }
  ~DeviceBytes() { cuMemFree(ptr); }
  DeviceBytes(const DeviceBytes&) = delete;
  char* at(size_t offset = 0) const { return reinterpret_cast<char*>(ptr) + offset; }
};

// Bit patterns of each floating type worth crossing with each other: zeros,
// infinities, NaNs (quiet, signalling, negative), the largest finite values,
// subnormals, one, and values whose sum or product rounds (ties included).
std::vector<uint64_t> edgeCodes(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC00001,
              0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x807FFFFF, 0x00800000, 0x3F800000, 0x3F800001,
              0xBF800000, 0x4B800001, 0x33800000, 0x3EAAAAAB};
    case DataType::kFloat64:
      return {0x0000000000000000, 0x8000000000000000, 0x7FF0000000000000, 0xFFF0000000000000,
              0x7FF8000000000000, 0x7FF0000000000001, 0x7FEFFFFFFFFFFFFF, 0xFFEFFFFFFFFFFFFF,
              0x0000000000000001, 0x800FFFFFFFFFFFFF, 0x3FF0000000000000, 0x3FF0000000000001,
              0xBFF0000000000000, 0x4340000000000001, 0x3CA0000000000000, 0x3FD5555555555555};
    case DataType::kFloat16:
      return {0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE01, 0x7BFF, 0xFBFF, 0x0001,
              0x83FF, 0x0400, 0x3C00, 0x3C01, 0xBC00, 0x6800, 0x1400, 0x3555};
    case DataType::kBfloat16:
      return {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFC1, 0x7F7F, 0xFF7F, 0x0001,
              0x807F, 0x0080, 0x3F80, 0x3F81, 0xBF80, 0x4B80, 0x3380, 0x3EAB};
    default:
      return {};  // integers and fp8: random bytes and all pairs cover them
  }
}

// Inputs of `count` elements: every pair of edge codes first, then random bytes.
void fillInputs(DataType t, size_t count, std::mt19937_64& rng, std::vector<char>& a,
                std::vector<char>& b) {
  const size_t size = dataTypeSize(t);
  a.resize(count * size);
  b.resize(count * size);
  for (auto& c : a) c = static_cast<char>(rng());
  for (auto& c : b) c = static_cast<char>(rng());
  const std::vector<uint64_t> edges = edgeCodes(t);
  size_t i = 0;
  for (uint64_t x : edges)
    for (uint64_t y : edges) {
      if (i >= count) return;
      std::memcpy(&a[i * size], &x, size);
      std::memcpy(&b[i * size], &y, size);
      ++i;
    }
}

// The host reducer's answer (the bit-exact reference; DeviceReducer's header
// says which host call each operator equals).
std::vector<char> hostReference(DataType t, ElementOp op, const std::vector<char>& a,
                                const std::vector<char>& b, size_t count, const ReduceScalar& s) {
  std::vector<char> out(a.size());
  switch (op) {
    case ElementOp::kSum: reduce::combine(ReduceOp::kSum, t, out.data(), a.data(), b.data(), count); break;
    case ElementOp::kProd: reduce::combine(ReduceOp::kProd, t, out.data(), a.data(), b.data(), count); break;
    case ElementOp::kMax: reduce::combine(ReduceOp::kMax, t, out.data(), a.data(), b.data(), count); break;
    case ElementOp::kMin: reduce::combine(ReduceOp::kMin, t, out.data(), a.data(), b.data(), count); break;
    case ElementOp::kPreMulSum:
      reduce::combine(ReduceOp::kPreMulSum, t, out.data(), a.data(), b.data(), count, &s.bits);
      break;
    case ElementOp::kAvg:
      if (isFloating(t)) {
        reduce::combine(ReduceOp::kPreMulSum, t, out.data(), a.data(), b.data(), count, &s.bits);
      } else {
        reduce::combine(ReduceOp::kSum, t, out.data(), a.data(), b.data(), count);
        reduce::divide(t, out.data(), out.data(), count, s.bits);
      }
      break;
  }
  return out;
}

// The scalar of op for type t: a random element for premulsum (edge codes
// included for floating types), the type's 1/n or n for avg.
ReduceScalar scalarFor(DataType t, ElementOp op, std::mt19937_64& rng) {
  if (op == ElementOp::kAvg) return ReduceScalar::avg(t, kAvgRanks);
  ReduceScalar s;
  if (op != ElementOp::kPreMulSum) return s;
  const std::vector<uint64_t> edges = edgeCodes(t);
  const uint64_t bits = !edges.empty() && rng() % 2 == 0 ? edges[rng() % edges.size()] : rng();
  return ReduceScalar::element(t, &bits);
}

// Index of the first element whose bytes differ, or -1.
long firstDifference(const std::vector<char>& got, const std::vector<char>& want, size_t size) {
  for (size_t i = 0; i * size < want.size(); ++i)
    if (std::memcmp(&got[i * size], &want[i * size], size) != 0) return long(i);
  return -1;
}

std::string hexElement(const std::vector<char>& v, long i, size_t size) {
  uint64_t x = 0;
  std::memcpy(&x, &v[size_t(i) * size], size);
  char text[24];
  std::snprintf(text, sizeof text, "0x%0*llx", int(size * 2), static_cast<unsigned long long>(x));
  return text;
}

// Runs one device reduction: a and b copied to device buffers at
// `offsetElements` past 256-byte-aligned allocations, launched on `stream`,
// read back. In place: dst is a's buffer.
std::vector<char> runOnDevice(const DeviceReducer& reducer, DataType t, ElementOp op,
                              const std::vector<char>& a, const std::vector<char>& b, size_t count,
                              const ReduceScalar& s, CUstream stream, size_t offsetElements,
                              bool inPlace) {
  const size_t size = dataTypeSize(t);
  const size_t offset = offsetElements * size;
  DeviceBytes da(a.size() + offset), db(b.size() + offset), dd(a.size() + offset);
  if (count) {
    CU_OK(cuMemcpyHtoD(da.ptr + offset, a.data(), a.size()));
    CU_OK(cuMemcpyHtoD(db.ptr + offset, b.data(), b.size()));
  }
  char* dst = inPlace ? da.at(offset) : dd.at(offset);
  Status st = reducer.launch(dst, da.at(offset), db.at(offset), count, t, op, s, stream);
  INFO(st.toString());
  REQUIRE(st.isOk());
  CU_OK(cuStreamSynchronize(stream));
  std::vector<char> out(a.size());
  if (count) CU_OK(cuMemcpyDtoH(out.data(), reinterpret_cast<CUdeviceptr>(dst), out.size()));
  return out;
}

TEST_CASE("device reduction: every type x operator equals the host reducer bit for bit",
          "[cudafake][reduce]") {
  Driver& driver = driverOnDevice0();
  Result<const DeviceReducer*> reducer = DeviceReducer::forCurrentContext(driver);
  INFO(reducer.status().toString());
  REQUIRE(reducer.isOk());
  CUstream stream = nullptr;
  CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  std::mt19937_64 rng(20261202);
  int compared = 0;
  for (DataType t : kAllTypes) {
    for (ElementOp op : kAllOps) {
      // count, offset in elements, in place
      struct Shape {
        size_t count;
        size_t offset;
        bool inPlace;
      };
      for (Shape shape : {Shape{1000, 0, false}, Shape{1, 0, false}, Shape{15, 1, true},
                          Shape{333, 3, false}, Shape{0, 0, false}}) {
        std::vector<char> a, b;
        fillInputs(t, shape.count, rng, a, b);
        const ReduceScalar s = scalarFor(t, op, rng);
        const std::vector<char> want = hostReference(t, op, a, b, shape.count, s);
        const std::vector<char> got =
            runOnDevice(**reducer, t, op, a, b, shape.count, s, stream, shape.offset, shape.inPlace);
        const long bad = firstDifference(got, want, dataTypeSize(t));
        INFO(DeviceReducer::kernelName(t, op) << ", " << shape.count << " elements at offset "
                                              << shape.offset << (shape.inPlace ? ", in place" : "")
                                              << ": element " << bad);
        if (bad >= 0) {
          INFO("a " << hexElement(a, bad, dataTypeSize(t)) << " b " << hexElement(b, bad, dataTypeSize(t))
                    << " scalar 0x" << std::hex << s.bits << ": device "
                    << hexElement(got, bad, dataTypeSize(t)) << ", host "
                    << hexElement(want, bad, dataTypeSize(t)));
          CHECK(bad < 0);
        }
        ++compared;
      }
    }
  }
  CHECK(compared == 12 * 6 * 5);
  CU_OK(cuStreamDestroy(stream));
}

TEST_CASE("device reduction: every pair of fp8 codes, every operator, equals the host reducer",
          "[cudafake][reduce]") {
  Driver& driver = driverOnDevice0();
  Result<const DeviceReducer*> reducer = DeviceReducer::forCurrentContext(driver);
  REQUIRE(reducer.isOk());
  CUstream stream = nullptr;
  CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  std::vector<char> a(65536), b(65536);
  for (size_t i = 0; i < 65536; ++i) {
    a[i] = static_cast<char>(i & 0xFF);
    b[i] = static_cast<char>(i >> 8);
  }
  for (DataType t : {DataType::kFloat8e4m3, DataType::kFloat8e5m2}) {
    for (ElementOp op : kAllOps) {
      // Scalars: 1/3 for avg; for premulsum every 17th code (NaN, max, subnormals among them).
      for (unsigned code = 0; code < 256; code += op == ElementOp::kPreMulSum ? 17 : 256) {
        const ReduceScalar s = op == ElementOp::kAvg ? ReduceScalar::avg(t, kAvgRanks)
                                                     : ReduceScalar::element(t, &code);
        const std::vector<char> want = hostReference(t, op, a, b, a.size(), s);
        const std::vector<char> got = runOnDevice(**reducer, t, op, a, b, a.size(), s, stream, 0, false);
        const long bad = firstDifference(got, want, 1);
        INFO(DeviceReducer::kernelName(t, op) << " scalar " << code << ": pair " << bad);
        CHECK(bad < 0);
      }
    }
  }
  CU_OK(cuStreamDestroy(stream));
}

TEST_CASE("device reduction: the loader resolves every kernel at once, and launches resolve none",
          "[cudafake][reduce]") {
  Driver& driver = driverOnDevice0();
  const auto loads = shoalFakeCudaCallCount("cuModuleLoadData");
  const auto gets = shoalFakeCudaCallCount("cuModuleGetFunction");
  const auto funcLoads = shoalFakeCudaCallCount("cuFuncLoad");
  Result<std::unique_ptr<DeviceReducer>> reducer = DeviceReducer::load(driver);
  INFO(reducer.status().toString());
  REQUIRE(reducer.isOk());
  // One image (the fatbin nvcc built: the stand-in finds each kernel's name
  // in it), 72 kernels resolved and loaded now.
  CHECK(shoalFakeCudaCallCount("cuModuleLoadData") == loads + 1);
  CHECK(shoalFakeCudaCallCount("cuModuleGetFunction") == gets + 72);
  CHECK(shoalFakeCudaCallCount("cuFuncLoad") == funcLoads + 72);
  CHECK((*reducer)->multiprocessors() == 132);  // the stand-in's device

  CUstream stream = nullptr;
  CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  DeviceBytes buf(64);
  const auto launches = shoalFakeCudaCallCount("cuLaunchKernel");
  for (DataType t : kAllTypes)
    for (ElementOp op : kAllOps) {
      const ReduceScalar s = op == ElementOp::kAvg ? ReduceScalar::avg(t, 2) : ReduceScalar{};
      REQUIRE((*reducer)->launch(buf.at(), buf.at(), buf.at(), 64 / dataTypeSize(t), t, op, s, stream).isOk());
    }
  CU_OK(cuStreamSynchronize(stream));
  CHECK(shoalFakeCudaCallCount("cuLaunchKernel") == launches + 72);
  CHECK(shoalFakeCudaCallCount("cuModuleGetFunction") == gets + 72);  // nothing resolved late
  CU_OK(cuStreamDestroy(stream));
}

// cudaDeviceReset (cuDevicePrimaryCtxReset) between communicators: the
// primary context comes back at the same handle without the modules and
// streams made in it, so what is made per context (the kernels, the
// loopback's copy stream) is keyed by its instance (cuCtxGetId), not by its
// handle.
TEST_CASE("device reduction: a context reset at the same handle loads the kernels again",
          "[cudafake][reduce]") {
  Driver& driver = driverOnDevice0();
  CUcontext ctx = nullptr;
  CU_OK(cuCtxGetCurrent(&ctx));
  unsigned long long before = 0, after = 0;
  CU_OK(cuCtxGetId(ctx, &before));
  auto use = [&](const char* when) {
    INFO(when);
    Result<const DeviceReducer*> reducer = DeviceReducer::forCurrentContext(driver);
    INFO(reducer.status().toString());
    REQUIRE(reducer.isOk());
    CUstream stream = nullptr;
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    DeviceBytes buf(64);
    const ReduceScalar none{};
    Status launched = reducer.value()->launch(buf.at(), buf.at(), buf.at(), 16, DataType::kFloat32,
                                              ElementOp::kSum, none, stream);
    INFO(launched.toString());
    CHECK(launched.isOk());
    uint64_t* word = nullptr;
    CU_OK(cuMemHostAlloc(reinterpret_cast<void**>(&word), sizeof *word, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    *word = 1;
    Status waited = driver.launchWait(word, 1, stream);  // the wait kernel, loaded per context too
    INFO(waited.toString());
    CHECK(waited.isOk());
    CU_OK(cuStreamSynchronize(stream));
    CU_OK(cuStreamDestroy(stream));
    CU_OK(cuMemFreeHost(word));
    // A message between threads on device buffers: one GPU copy, on the
    // loopback's own stream of this context.
    auto [a, b] = makeLoopbackPair("rank 0", "rank 1");
    DeviceBytes from(256), to(256);
    CU_OK(cuMemsetD8(from.ptr, 7, 256));
    CU_OK(cuMemsetD8(to.ptr, 0, 256));
    REQUIRE(a->postSend(from.at(), 256, 1, 1).isOk());
    REQUIRE(b->postRecv(to.at(), 256, 1, 2).isOk());
    std::vector<Completion> done;
    Status moved;
    for (int i = 0; i < 1000 && moved.isOk() && a->pending() + b->pending() > 0; ++i) {
      bool progressed = false;
      moved = a->poll(done, progressed);
      if (moved.isOk()) moved = b->poll(done, progressed);
    }
    INFO(moved.toString());
    CHECK(moved.isOk());
    std::vector<unsigned char> got(256);
    CU_OK(cuMemcpyDtoH(got.data(), to.ptr, 256));
    CHECK(got == std::vector<unsigned char>(256, 7));
    return reducer.value();
  };
  const DeviceReducer* first = use("before the reset");
  CU_OK(cuDevicePrimaryCtxReset(0));
  CUcontext again = nullptr;
  CU_OK(cuDevicePrimaryCtxRetain(&again, 0));
  CU_OK(cuCtxSetCurrent(again));
  REQUIRE(again == ctx);  // the same handle: only the instance tells them apart
  CU_OK(cuCtxGetId(again, &after));
  REQUIRE(after != before);
  const auto loads = shoalFakeCudaCallCount("cuModuleLoadData");
  const DeviceReducer* second = use("after the reset");
  CHECK(second != first);
  CHECK(shoalFakeCudaCallCount("cuModuleLoadData") == loads + 2);  // the reduction kernels and the wait kernel
}

TEST_CASE("device reduction: a kernel missing from the image fails the load, naming it",
          "[cudafake][reduce]") {
  Driver& driver = driverOnDevice0();
  shoalFakeCudaHideKernel("shoal_reduce_avg_bfloat16");
  Result<std::unique_ptr<DeviceReducer>> reducer = DeviceReducer::load(driver);
  REQUIRE_FALSE(reducer.isOk());
  INFO(reducer.status().toString());
  CHECK(reducer.status().message().find("shoal_reduce_avg_bfloat16") != std::string::npos);
  CHECK(reducer.status().message().find("device reduction kernels") != std::string::npos);
  // The cached form says the same, and keeps saying it.
  for (int i = 0; i < 2; ++i) {
    Result<const DeviceReducer*> cached = DeviceReducer::forCurrentContext(driver);
    REQUIRE_FALSE(cached.isOk());
    CHECK(cached.status().message().find("shoal_reduce_avg_bfloat16") != std::string::npos);
  }
  shoalFakeCudaHideKernel(nullptr);
  CHECK(DeviceReducer::load(driver).isOk());
}

TEST_CASE("device reduction: premulsum reads a device scalar when the kernel runs",
          "[cudafake][reduce]") {
  Driver& driver = driverOnDevice0();
  Result<const DeviceReducer*> reducer = DeviceReducer::forCurrentContext(driver);
  REQUIRE(reducer.isOk());
  CUstream stream = nullptr;
  CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  constexpr size_t n = 100;
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = float(i);
    b[i] = 0.5f;
  }
  DeviceBytes da(n * 4), db(n * 4), dd(n * 4), scalar(4);
  CU_OK(cuMemcpyHtoD(da.ptr, a.data(), n * 4));
  CU_OK(cuMemcpyHtoD(db.ptr, b.data(), n * 4));
  const float two = 2.0f, three = 3.0f;
  CU_OK(cuMemcpyHtoD(scalar.ptr, &two, 4));
  // The stream is held back; the scalar changes after the launch, before the kernel runs.
  CU_OK(shoalFakeCudaStreamDelay(stream, 200));
  REQUIRE((*reducer)
              ->launch(dd.at(), da.at(), db.at(), n, DataType::kFloat32, ElementOp::kPreMulSum,
                       ReduceScalar::onDevice(scalar.at()), stream)
              .isOk());
  CU_OK(cuMemcpyHtoD(scalar.ptr, &three, 4));
  CU_OK(cuStreamSynchronize(stream));
  std::vector<float> out(n);
  CU_OK(cuMemcpyDtoH(out.data(), dd.ptr, n * 4));
  for (size_t i = 0; i < n; ++i) {
    INFO("element " << i);
    CHECK(out[i] == float(i) * 3.0f + 0.5f);
  }
  CU_OK(cuStreamDestroy(stream));
}

TEST_CASE("device reduction: bad arguments are refused with the reason", "[cudafake][reduce]") {
  Driver& driver = driverOnDevice0();
  Result<const DeviceReducer*> reducer = DeviceReducer::forCurrentContext(driver);
  REQUIRE(reducer.isOk());
  const DeviceReducer& r = **reducer;
  DeviceBytes buf(256);
  CUstream stream = nullptr;
  CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  auto refused = [&](Status st, const char* reason) {
    INFO(st.toString());
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK(st.message().find(reason) != std::string::npos);
  };
  const ReduceScalar none;
  refused(r.launch(nullptr, buf.at(), buf.at(), 4, DataType::kFloat32, ElementOp::kSum, none, stream), "NULL");
  refused(r.launch(buf.at(2), buf.at(), buf.at(), 4, DataType::kFloat32, ElementOp::kSum, none, stream),
          "not aligned to the 4-byte element");
  refused(r.launch(buf.at(), buf.at(), buf.at(), 4, DataType::kInt32, ElementOp::kAvg, ReduceScalar{}, stream),
          "the divisor is 0");
  refused(r.launch(buf.at(), buf.at(), buf.at(), 4, DataType::kFloat32, ElementOp::kSum,
                   ReduceScalar::onDevice(buf.at()), stream),
          "only premulsum reads its scalar from device memory");
  refused(r.launch(buf.at(), buf.at(), buf.at(), 4, DataType::kFloat64, ElementOp::kPreMulSum,
                   ReduceScalar::onDevice(buf.at(4)), stream),
          "the scalar at");
  refused(r.launch(buf.at(), buf.at(), buf.at(), 4, DataType(12), ElementOp::kSum, none, stream),
          "unknown data type 12");
  refused(r.launch(buf.at(), buf.at(), buf.at(), 4, DataType::kInt8, ElementOp(6), none, stream),
          "unknown operator 6");
  // Nothing was launched; count 0 launches nothing either.
  const auto launches = shoalFakeCudaCallCount("cuLaunchKernel");
  CHECK(r.launch(nullptr, nullptr, nullptr, 0, DataType::kInt8, ElementOp::kSum, none, stream).isOk());
  CHECK(shoalFakeCudaCallCount("cuLaunchKernel") == launches);
  CU_OK(cuStreamDestroy(stream));
}

TEST_CASE("device reduction: launch shape", "[cudafake][reduce]") {
  Driver& driver = driverOnDevice0();
  Result<const DeviceReducer*> reducer = DeviceReducer::forCurrentContext(driver);
  REQUIRE(reducer.isOk());
  const DeviceReducer& r = **reducer;
  CHECK(r.blocksFor(0) == 1);
  CHECK(r.blocksFor(1) == 1);
  CHECK(r.blocksFor(64 << 10) == 1);
  CHECK(r.blocksFor((64 << 10) + 1) == 2);
  CHECK(r.blocksFor(size_t(10) << 20) == 160);
  CHECK(r.blocksFor(size_t(1) << 30) == 132 * 4);  // a full grid: 2048 threads per SM
}

TEST_CASE("device reduction: a device communicator's first use loads every kernel, later ones none",
          "[cudafake][reduce]") {
  driverOnDevice0();
  ncclComm_t comm = nullptr;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  CUstream stream = nullptr;
  CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  DeviceBytes buf(1024);
  CU_OK(cuMemsetD8(buf.ptr, 0, 1024));
  const auto gets = shoalFakeCudaCallCount("cuModuleGetFunction");
  const auto funcLoads = shoalFakeCudaCallCount("cuFuncLoad");
  REQUIRE(ncclAllReduce(buf.at(), buf.at(), 256, ncclFloat, ncclSum, comm, stream) == ncclSuccess);
  CU_OK(cuStreamSynchronize(stream));
  // 72 reduction kernels (the stand-in's device has memory operations: no wait kernel).
  CHECK(shoalFakeCudaCallCount("cuModuleGetFunction") == gets + 72);
  CHECK(shoalFakeCudaCallCount("cuFuncLoad") == funcLoads + 72);
  for (int i = 0; i < 3; ++i)
    REQUIRE(ncclAllReduce(buf.at(), buf.at(), 256, ncclFloat, ncclSum, comm, stream) == ncclSuccess);
  CU_OK(cuStreamSynchronize(stream));
  CHECK(shoalFakeCudaCallCount("cuModuleGetFunction") == gets + 72);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  CU_OK(cuStreamDestroy(stream));
}

TEST_CASE("device reduction: a device communicator works without the kernels", "[cudafake][reduce]") {
  driverOnDevice0();
  shoalFakeCudaHideKernel("shoal_reduce_sum_float");
  ncclComm_t comm = nullptr;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  CUstream stream = nullptr;
  CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  std::vector<float> host(256, 1.5f);
  DeviceBytes buf(1024);
  CU_OK(cuMemcpyHtoD(buf.ptr, host.data(), 1024));
  REQUIRE(ncclAllReduce(buf.at(), buf.at(), 256, ncclFloat, ncclSum, comm, stream) == ncclSuccess);
  CU_OK(cuStreamSynchronize(stream));
  std::vector<float> out(256);
  CU_OK(cuMemcpyDtoH(out.data(), buf.ptr, 1024));
  CHECK(out == host);  // staged through host memory, as before
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  CU_OK(cuStreamDestroy(stream));
}

TEST_CASE("device reduction: the stand-in refuses launches a GPU would fault on", "[cudafake][reduce]") {
  driverOnDevice0();
  CUmodule module = nullptr;
  CU_OK(cuModuleLoadData(&module, reduceKernelsImage()));
  CUfunction sum = nullptr, avg = nullptr;
  CU_OK(cuModuleGetFunction(&sum, module, "shoal_reduce_sum_float"));
  CU_OK(cuModuleGetFunction(&avg, module, "shoal_reduce_avg_int32"));
  CUfunction missing = nullptr;
  CHECK(cuModuleGetFunction(&missing, module, "shoal_reduce_sum_complex") == CUDA_ERROR_NOT_FOUND);
  CUstream stream = nullptr;
  CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  DeviceBytes buf(64);
  std::vector<float> pageable(16);
  auto launch = [&](CUfunction f, CUdeviceptr dst, CUdeviceptr a, unsigned long long count,
                    unsigned long long bits, unsigned threads) {
    CUdeviceptr b = buf.ptr, scalar = 0;
    void* args[] = {&dst, &a, &b, &count, &scalar, &bits};
    return cuLaunchKernel(f, 1, 1, 1, threads, 1, 1, 0, stream, args, nullptr);
  };
  CHECK(launch(sum, buf.ptr, buf.ptr, 16, 0, 512) == CUDA_SUCCESS);
  CHECK(launch(sum, buf.ptr + 2, buf.ptr, 8, 0, 512) == CUDA_ERROR_MISALIGNED_ADDRESS);
  CHECK(launch(sum, buf.ptr, reinterpret_cast<CUdeviceptr>(pageable.data()), 16, 0, 512) ==
        CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(launch(sum, buf.ptr, buf.ptr, 17, 0, 512) == CUDA_ERROR_ILLEGAL_ADDRESS);  // past the end
  CHECK(launch(sum, buf.ptr, buf.ptr, 16, 0, 1024) == CUDA_ERROR_INVALID_VALUE);   // launch bounds
  CHECK(launch(avg, buf.ptr, buf.ptr, 16, 0, 512) == CUDA_ERROR_INVALID_VALUE);    // divide by 0
  CHECK(launch(avg, buf.ptr, buf.ptr, 16, 3, 512) == CUDA_SUCCESS);
  CU_OK(cuStreamSynchronize(stream));
  CU_OK(cuStreamDestroy(stream));
  CU_OK(cuModuleUnload(module));
}

}  // namespace
}  // namespace shoal::cuda
