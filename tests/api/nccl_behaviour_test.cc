// NCCL behaviours of the public C API, in one process (CTest label "api").
//
// Role: the contract users rely on, written against NCCL's documented semantics
// (Shoal's side: docs/nccl-compat.md) and using only <nccl.h> and
// <shoal/shoal.h>.
// Ranks live in this process: ncclCommInitAll (loopback) driven by one thread
// with ncclGroupStart / one call per comm / ncclGroupEnd, or one thread per
// rank with ncclGetUniqueId + ncclCommInitRank (loopback, or tcp on 127.0.0.1
// with SHOAL_TRANSPORT=tcp).
//
// Host memory with the NULL stream: an operation is complete when the call
// (inside a group: the outermost ncclGroupEnd) returns, so data is checked
// right after it.
//
// Bounds: every wait in the library has a deadline; this file sets the
// no-progress and init deadlines to 30 s (unless the environment already sets
// them) so that a broken behaviour fails instead of hanging.
#include <nccl.h>
#include <shoal/shoal.h>

#include "api/api_guard.h"  // ncclComm's shared state: CommCall's mark
#include "memory/known_ranges.h"

#include <catch2/catch.hpp>

#include <dirent.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/nccl_ok.h"
#include "support/scoped_env.h"

namespace {

// ---------------------------------------------------------------------------
// Process set-up: bounded deadlines and the loopback interface, before any
// Shoal call (parameters are read once per process).
// ---------------------------------------------------------------------------

const bool kEnvReady = [] {
  ::setenv("SHOAL_PROGRESS_TIMEOUT_MS", "30000", 0);
  ::setenv("SHOAL_INIT_TIMEOUT_MS", "30000", 0);
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  return true;
}();

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string lastError() { return ncclGetLastError(nullptr); }

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

bool mentions(const std::string& text, const std::string& word) {
  return lower(text).find(lower(word)) != std::string::npos;
}


#define NCCL_EXPECT(call, want)                                                        \
  do {                                                                                 \
    ncclResult_t rc_ = (call);                                                         \
    INFO(#call << " returned " << ncclGetErrorString(rc_) << " (" << int(rc_)          \
               << "); last error: " << ncclGetLastError(nullptr));                     \
    CHECK(rc_ == (want));                                                              \
  } while (0)

// ---------------------------------------------------------------------------
// Element types: encode/decode exactly representable values of all 12 types.
// ---------------------------------------------------------------------------

// IEEE-style binary floats with E exponent bits and M mantissa bits (half,
// bfloat16, fp8 e4m3 and e5m2). Values used here are exactly representable.
uint32_t encodeMini(double v, int E, int M) {
  if (v == 0) return 0;
  const int bias = (1 << (E - 1)) - 1;
  uint32_t sign = v < 0 ? 1u : 0u;
  double a = std::fabs(v);
  int e = 0;
  (void)std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;          // a = (1.f) * 2^exp
  int field = exp + bias;
  uint32_t mant;
  if (field >= 1) {
    mant = static_cast<uint32_t>(std::nearbyint((a / std::ldexp(1.0, exp) - 1.0) * (1 << M)));
    if (mant == (1u << M)) {
      mant = 0;
      ++field;
    }
  } else {
    field = 0;
    mant = static_cast<uint32_t>(std::nearbyint(a / std::ldexp(1.0, 1 - bias - M)));
  }
  return (sign << (E + M)) | (static_cast<uint32_t>(field) << M) | mant;
}

double decodeMini(uint32_t bits, int E, int M, bool e4m3) {
  const int bias = (1 << (E - 1)) - 1;
  uint32_t sign = (bits >> (E + M)) & 1u;
  int field = static_cast<int>((bits >> M) & ((1u << E) - 1u));
  uint32_t mant = bits & ((1u << M) - 1u);
  double v;
  if (e4m3 && field == 15 && mant == 7) return std::nan("");
  if (!e4m3 && field == (1 << E) - 1) return mant ? std::nan("") : (sign ? -INFINITY : INFINITY);
  if (field == 0) v = std::ldexp(static_cast<double>(mant), 1 - bias - M);
  else v = std::ldexp(1.0 + static_cast<double>(mant) / (1 << M), field - bias);
  return sign ? -v : v;
}

struct TypeInfo {
  ncclDataType_t type;
  const char* name;
  size_t size;
  bool floating;
  bool isSigned;
  double eps;  // unit roundoff of floating types (for ncclAvg with non-power-of-2 ranks)
  std::function<void(double, void*)> encode;
  std::function<double(const void*)> decode;
};

template <typename T>
TypeInfo intType(ncclDataType_t type, const char* name) {
  return {type,
          name,
          sizeof(T),
          false,
          std::is_signed_v<T>,
          0,
          [](double v, void* p) {
            T x = static_cast<T>(v);
            std::memcpy(p, &x, sizeof(T));
          },
          [](const void* p) {
            T x;
            std::memcpy(&x, p, sizeof(T));
            return static_cast<double>(x);
          }};
}

template <typename T>
TypeInfo ieeeType(ncclDataType_t type, const char* name, double eps) {
  return {type,
          name,
          sizeof(T),
          true,
          true,
          eps,
          [](double v, void* p) {
            T x = static_cast<T>(v);
            std::memcpy(p, &x, sizeof(T));
          },
          [](const void* p) {
            T x;
            std::memcpy(&x, p, sizeof(T));
            return static_cast<double>(x);
          }};
}

TypeInfo miniType(ncclDataType_t type, const char* name, int E, int M, double eps) {
  size_t size = (1 + E + M) / 8;
  bool e4m3 = (E == 4 && M == 3);
  return {type,
          name,
          size,
          true,
          true,
          eps,
          [E, M, size](double v, void* p) {
            uint32_t bits = encodeMini(v, E, M);
            if (size == 1) {
              uint8_t b = static_cast<uint8_t>(bits);
              std::memcpy(p, &b, 1);
            } else {
              uint16_t b = static_cast<uint16_t>(bits);
              std::memcpy(p, &b, 2);
            }
          },
          [E, M, size, e4m3](const void* p) {
            uint32_t bits;
            if (size == 1) {
              uint8_t b;
              std::memcpy(&b, p, 1);
              bits = b;
            } else {
              uint16_t b;
              std::memcpy(&b, p, 2);
              bits = b;
            }
            return decodeMini(bits, E, M, e4m3);
          }};
}

const std::vector<TypeInfo>& allTypes() {
  static const std::vector<TypeInfo> types = {
      intType<int8_t>(ncclInt8, "int8"),
      intType<uint8_t>(ncclUint8, "uint8"),
      intType<int32_t>(ncclInt32, "int32"),
      intType<uint32_t>(ncclUint32, "uint32"),
      intType<int64_t>(ncclInt64, "int64"),
      intType<uint64_t>(ncclUint64, "uint64"),
      miniType(ncclFloat16, "half", 5, 10, std::ldexp(1.0, -11)),
      ieeeType<float>(ncclFloat32, "float", std::ldexp(1.0, -24)),
      ieeeType<double>(ncclFloat64, "double", std::ldexp(1.0, -53)),
      miniType(ncclBfloat16, "bfloat16", 8, 7, std::ldexp(1.0, -8)),
      miniType(ncclFloat8e4m3, "fp8e4m3", 4, 3, std::ldexp(1.0, -4)),
      miniType(ncclFloat8e5m2, "fp8e5m2", 5, 2, std::ldexp(1.0, -3)),
  };
  return types;
}

const TypeInfo& typeOf(ncclDataType_t t) {
  for (const auto& ti : allTypes())
    if (ti.type == t) return ti;
  throw std::runtime_error("unknown type");
}

// A typed host buffer.
class Buf {
 public:
  Buf() = default;
  Buf(const TypeInfo& t, size_t count) : t_(&t), bytes_(count * t.size + 64, 0xA5), count_(count) {}
  size_t count() const { return count_; }
  void set(size_t i, double v) { t_->encode(v, bytes_.data() + i * t_->size); }
  double get(size_t i) const { return t_->decode(bytes_.data() + i * t_->size); }
  void* at(size_t elem = 0) { return bytes_.data() + elem * t_->size; }
  void fill(const std::function<double(size_t)>& f) {
    for (size_t i = 0; i < count_; ++i) set(i, f(i));
  }
  // Guard bytes past the end must stay untouched.
  bool tailIntact() const {
    for (size_t b = count_ * t_->size; b < bytes_.size(); ++b)
      if (bytes_[b] != 0xA5) return false;
    return true;
  }

 private:
  const TypeInfo* t_ = nullptr;
  std::vector<unsigned char> bytes_;
  size_t count_ = 0;
};

// Compares every element; reports the first mismatch.
void checkBuf(const Buf& b, const std::function<double(size_t)>& want, const std::string& what,
              double tol = 0) {
  INFO(what);
  for (size_t i = 0; i < b.count(); ++i) {
    double got = b.get(i), w = want(i);
    if (!(std::fabs(got - w) <= tol)) {
      FAIL_CHECK("element " << i << " is " << got << ", expected " << w << " (tolerance " << tol << ")");
      return;
    }
  }
  CHECK(b.tailIntact());
}

// ---------------------------------------------------------------------------
// World: n ranks of one process from ncclCommInitAll, driven by this thread.
// ---------------------------------------------------------------------------

class World {
 public:
  explicit World(int n, const int* devlist = nullptr) : comms_(n, nullptr) {
    ncclResult_t rc = ncclCommInitAll(comms_.data(), n, devlist);
    if (rc != ncclSuccess)
      FAIL("ncclCommInitAll(" << n << ") returned " << ncclGetErrorString(rc) << ": "
                              << ncclGetLastError(nullptr));
    for (auto c : comms_) REQUIRE(c != nullptr);
  }
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  ~World() {
    for (auto& c : comms_)
      if (c) (void)ncclCommDestroy(c);
  }
  int size() const { return static_cast<int>(comms_.size()); }
  ncclComm_t operator[](int r) const { return comms_[r]; }
  // Forget a comm the test destroyed or aborted itself.
  void release(int r) { comms_[r] = nullptr; }

 private:
  std::vector<ncclComm_t> comms_;
};

// Runs fn(r) for r in [0, n) inside one group and ends the group whatever
// happens (so that a failing call cannot leave this thread inside a group).
void grouped(int n, const std::function<ncclResult_t(int)>& fn) {
  NCCL_OK(ncclGroupStart());
  std::vector<ncclResult_t> rcs(n, ncclSuccess);
  std::vector<std::string> errs(n);
  for (int r = 0; r < n; ++r) {
    rcs[r] = fn(r);
    if (rcs[r] != ncclSuccess) errs[r] = lastError();
  }
  ncclResult_t end = ncclGroupEnd();
  std::string endErr = end == ncclSuccess ? "" : lastError();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << " call inside the group: " << errs[r]);
    CHECK(rcs[r] == ncclSuccess);
  }
  INFO("ncclGroupEnd: " << endErr);
  REQUIRE(end == ncclSuccess);
}

// An AllReduce sum on every rank of a world; the communicators still work.
void requireWorking(const World& w) {
  const int n = w.size();
  const TypeInfo& t = typeOf(ncclFloat32);
  std::vector<Buf> send, recv;
  for (int r = 0; r < n; ++r) {
    send.emplace_back(t, 257);
    recv.emplace_back(t, 257);
    send[r].fill([r](size_t i) { return static_cast<double>((r + i) % 5); });
  }
  grouped(n, [&](int r) {
    return ncclAllReduce(send[r].at(), recv[r].at(), 257, ncclFloat32, ncclSum, w[r], nullptr);
  });
  for (int r = 0; r < n; ++r)
    checkBuf(recv[r], [n](size_t i) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += static_cast<double>((q + i) % 5);
      return s;
    }, "the communicators still work (AllReduce)");
  for (int r = 0; r < n; ++r) {
    ncclResult_t async = ncclInternalError;
    NCCL_OK(ncclCommGetAsyncError(w[r], &async));
    CHECK(async == ncclSuccess);
  }
}

// Small-integer inputs per reduction operator, exactly representable in every
// type and with every partial result exact (fp8 e5m2 holds the integers 0..8).
double inputFor(int op, const TypeInfo& t, int r, size_t i) {
  const bool sgn = t.isSigned;
  const long ri = static_cast<long>(r), ii = static_cast<long>(i);
  switch (op) {
    case ncclSum: return sgn ? ((ri * 7 + ii * 3) % 5) - 2 : (ri + ii) % 3;
    case ncclProd: {
      double mag = 1 + (ri + ii) % 2;
      return (sgn && (ri * 5 + ii) % 3 == 0) ? -mag : mag;
    }
    case ncclMax:
    case ncclMin: return sgn ? ((ri * 5 + ii * 3) % 7) - 3 : (ri * 5 + ii * 3) % 7;
    case ncclAvg: return (ri + 2 * ii) % 3;
    default: /* PreMulSum */ return sgn ? ((ri + ii) % 3) - 1 : (ri + ii) % 2;
  }
}

// The scalar of rank r in PreMulSum tests (nccl-tests: 1 on even, 2 on odd).
double preMulScalar(int r) { return r % 2 == 0 ? 1 : 2; }

double expectedFor(int op, const TypeInfo& t, int n, size_t i) {
  double acc = 0;
  switch (op) {
    case ncclSum:
    case ncclAvg:
      for (int r = 0; r < n; ++r) acc += inputFor(op, t, r, i);
      if (op == ncclAvg) acc = t.floating ? acc / n : std::floor(acc / n);
      return acc;
    case ncclProd:
      acc = 1;
      for (int r = 0; r < n; ++r) acc *= inputFor(op, t, r, i);
      return acc;
    case ncclMax:
      acc = -1e9;
      for (int r = 0; r < n; ++r) acc = std::max(acc, inputFor(op, t, r, i));
      return acc;
    case ncclMin:
      acc = 1e9;
      for (int r = 0; r < n; ++r) acc = std::min(acc, inputFor(op, t, r, i));
      return acc;
    default:
      for (int r = 0; r < n; ++r) acc += preMulScalar(r) * inputFor(op, t, r, i);
      return acc;
  }
}

const char* opName(int op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    default: return "premulsum";
  }
}

// Element values of the data-movement tests (exact in float and uint8).
double val(int r, size_t i) { return static_cast<double>((r * 5 + static_cast<int>(i % 251)) % 13); }

// Runs one unique-id communicator per thread; body(rank, comm) returns an
// error text ("" = pass). Init/destroy errors are reported too.
std::vector<std::string> runThreads(int n, const std::function<std::string(int, ncclComm_t)>& body) {
  ncclUniqueId id;
  std::vector<std::string> errors(n);
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    errors.assign(n, "ncclGetUniqueId failed: " + lastError());
    return errors;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ncclComm_t comm = nullptr;
      ncclResult_t rc = ncclCommInitRank(&comm, n, id, r);
      if (rc != ncclSuccess) {
        errors[r] = std::string("ncclCommInitRank: ") + ncclGetErrorString(rc) + ": " + lastError();
        return;
      }
      errors[r] = body(r, comm);
      rc = ncclCommDestroy(comm);
      if (rc != ncclSuccess && errors[r].empty())
        errors[r] = std::string("ncclCommDestroy: ") + ncclGetErrorString(rc) + ": " + lastError();
    });
  for (auto& t : threads) t.join();
  return errors;
}

#define T_CHECK(cond, what)                                                       \
  do {                                                                            \
    if (!(cond)) return std::string("line ") + std::to_string(__LINE__) + ": " + \
                        #cond + " -- " + (what);                                  \
  } while (0)
#define T_NCCL(call)                                                                        \
  do {                                                                                      \
    ncclResult_t rc_ = (call);                                                              \
    if (rc_ != ncclSuccess)                                                                 \
      return std::string("line ") + std::to_string(__LINE__) + ": " + #call + " -> " +    \
             ncclGetErrorString(rc_) + ": " + ncclGetLastError(nullptr);                    \
  } while (0)

// The body of the threaded tests: several collectives with data checks.
std::string threadedCollectives(int n, int r, ncclComm_t comm) {
  int count = -1, rank = -1;
  T_NCCL(ncclCommCount(comm, &count));
  T_NCCL(ncclCommUserRank(comm, &rank));
  T_CHECK(count == n && rank == r, "Count/UserRank");
  const size_t N = 70001;
  std::vector<float> send(N), recv(N * n, -1.f);
  for (size_t i = 0; i < N; ++i) send[i] = static_cast<float>(val(r, i));
  T_NCCL(ncclAllReduce(send.data(), recv.data(), N, ncclFloat, ncclSum, comm, nullptr));
  for (size_t i = 0; i < N; ++i) {
    float s = 0;
    for (int q = 0; q < n; ++q) s += static_cast<float>(val(q, i));
    T_CHECK(recv[i] == s, "AllReduce element " + std::to_string(i));
  }
  T_NCCL(ncclAllGather(send.data(), recv.data(), N, ncclFloat, comm, nullptr));
  for (size_t j = 0; j < N * n; ++j)
    T_CHECK(recv[j] == static_cast<float>(val(static_cast<int>(j / N), j % N)),
            "AllGather element " + std::to_string(j));
  std::vector<float> b(N);
  const int root = n - 1;
  T_NCCL(ncclBroadcast(send.data(), b.data(), N, ncclFloat, root, comm, nullptr));
  for (size_t i = 0; i < N; ++i)
    T_CHECK(b[i] == static_cast<float>(val(root, i)), "Broadcast element " + std::to_string(i));
  // Ring exchange in a group.
  std::vector<float> got(N, -1.f);
  T_NCCL(ncclGroupStart());
  T_NCCL(ncclSend(send.data(), N, ncclFloat, (r + 1) % n, comm, nullptr));
  T_NCCL(ncclRecv(got.data(), N, ncclFloat, (r + n - 1) % n, comm, nullptr));
  T_NCCL(ncclGroupEnd());
  for (size_t i = 0; i < N; ++i)
    T_CHECK(got[i] == static_cast<float>(val((r + n - 1) % n, i)), "ring element " + std::to_string(i));
  return "";
}

void requireNoErrors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r].empty());
  }
}

// Polls ncclCommGetAsyncError until the state leaves ncclInProgress.
ncclResult_t waitAsync(ncclComm_t comm, int timeoutMs = 30000) {
  auto t0 = Clock::now();
  ncclResult_t state = ncclInProgress;
  while (msSince(t0) < timeoutMs) {
    ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return rc;
    if (state != ncclInProgress) return state;
    std::this_thread::yield();
  }
  return ncclInProgress;
}

ncclUniqueId newId() {
  ncclUniqueId id;
  ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess) FAIL("ncclGetUniqueId: " << lastError());
  return id;
}

}  // namespace

// ===========================================================================
// Version and error strings
// ===========================================================================

TEST_CASE("version is 2.30.7 (23007)", "[api]") {
  STATIC_REQUIRE(NCCL_VERSION_CODE == 23007);
  STATIC_REQUIRE(NCCL_VERSION(2, 30, 7) == 23007);
  STATIC_REQUIRE(NCCL_VERSION(2, 8, 4) == 2804);
  int v = 0;
  NCCL_OK(ncclGetVersion(&v));
  CHECK(v == 23007);
  NCCL_EXPECT(ncclGetVersion(nullptr), ncclInvalidArgument);
  int major = -1, minor = -1, patch = -1;
  NCCL_OK(shoalGetVersion(&major, &minor, &patch));
  CHECK(major == SHOAL_VERSION_MAJOR);
  CHECK(minor == SHOAL_VERSION_MINOR);
  CHECK(patch == SHOAL_VERSION_PATCH);
  REQUIRE(shoalGetVersionString() != nullptr);
  CHECK(mentions(shoalGetVersionString(), "shoal"));
}

TEST_CASE("error strings are NCCL's", "[api]") {
  CHECK(std::string(ncclGetErrorString(ncclSuccess)) == "no error");
  CHECK(std::string(ncclGetErrorString(ncclUnhandledCudaError)) ==
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details)");
  CHECK(std::string(ncclGetErrorString(ncclSystemError)) ==
        "unhandled system error (run with NCCL_DEBUG=INFO for details)");
  CHECK(std::string(ncclGetErrorString(ncclInternalError)) ==
        "internal error - please report this issue to the NCCL developers");
  CHECK(std::string(ncclGetErrorString(ncclInvalidArgument)) ==
        "invalid argument (run with NCCL_DEBUG=WARN for details)");
  CHECK(std::string(ncclGetErrorString(ncclInvalidUsage)) ==
        "invalid usage (run with NCCL_DEBUG=WARN for details)");
  CHECK(std::string(ncclGetErrorString(ncclRemoteError)) ==
        "remote process exited or there was a network error");
  CHECK(std::string(ncclGetErrorString(ncclInProgress)) == "NCCL operation in progress");
  CHECK(std::string(ncclGetErrorString(ncclTimeout)) == "timeout");
  CHECK(std::string(ncclGetErrorString(ncclNumResults)) == "unknown result code");
  CHECK(std::string(ncclGetErrorString(static_cast<ncclResult_t>(1234))) == "unknown result code");
  REQUIRE(ncclGetLastError(nullptr) != nullptr);
}

// ===========================================================================
// Init, queries, teardown
// ===========================================================================

TEST_CASE("ncclCommInitAll: queries - devlist - argument errors", "[api]") {
  {
    World w(3);
    for (int r = 0; r < 3; ++r) {
      int count = -1, rank = -1, dev = -7;
      NCCL_OK(ncclCommCount(w[r], &count));
      NCCL_OK(ncclCommUserRank(w[r], &rank));
      NCCL_OK(ncclCommCuDevice(w[r], &dev));
      CHECK(count == 3);
      CHECK(rank == r);
      CHECK(dev == r);
    }
    NCCL_EXPECT(ncclCommCount(w[0], nullptr), ncclInvalidArgument);
    NCCL_EXPECT(ncclCommUserRank(w[0], nullptr), ncclInvalidArgument);
  }
  {
    const int devs[3] = {5, 3, 9};
    World w(3, devs);
    for (int r = 0; r < 3; ++r) {
      int dev = -1;
      NCCL_OK(ncclCommCuDevice(w[r], &dev));
      CHECK(dev == devs[r]);
    }
  }
  ncclComm_t comms[4] = {};
  NCCL_EXPECT(ncclCommInitAll(nullptr, 2, nullptr), ncclInvalidArgument);
  NCCL_EXPECT(ncclCommInitAll(comms, 0, nullptr), ncclInvalidArgument);
  // A device twice: tests/api/edge_semantics_test.cc, "edge: ncclCommInitAll".
  int count = 0;
  NCCL_EXPECT(ncclCommCount(nullptr, &count), ncclInvalidArgument);
}

TEST_CASE("ncclCommInitRank: argument errors and malformed unique ids", "[api]") {
  ncclUniqueId id = newId();
  ncclComm_t comm = nullptr;
  NCCL_EXPECT(ncclCommInitRank(nullptr, 1, id, 0), ncclInvalidArgument);
  NCCL_EXPECT(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  NCCL_EXPECT(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  NCCL_EXPECT(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument);

  ncclUniqueId zero;
  std::memset(&zero, 0, sizeof(zero));
  auto t0 = Clock::now();
  NCCL_EXPECT(ncclCommInitRank(&comm, 1, zero, 0), ncclInvalidArgument);
  CHECK(msSince(t0) < 5000);

  ncclUniqueId junk;
  std::mt19937 rng(7);
  for (auto& b : junk.internal) b = static_cast<char>(rng());
  t0 = Clock::now();
  NCCL_EXPECT(ncclCommInitRank(&comm, 1, junk, 0), ncclInvalidArgument);
  CHECK(msSince(t0) < 5000);

  // The valid id still works afterwards.
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  NCCL_OK(ncclCommDestroy(comm));
}

// A nonblocking init inside a group starts at ncclGroupEnd, which returns
// ncclInProgress at once, as NCCL's does: one thread can then start every
// rank's init through groups of its own (it had waited for each to finish,
// so the first waited for a rank the thread had not started yet).
TEST_CASE("nonblocking inits in separate groups from one thread: ncclGroupEnd returns ncclInProgress", "[api][group]") {
  shoal::testing::ScopedEnv env{{"SHOAL_INIT_TIMEOUT_MS", "10000"}};
  ncclUniqueId id = newId();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comms[2] = {nullptr, nullptr};
  auto t0 = Clock::now();
  for (int r = 0; r < 2; ++r) {
    NCCL_OK(ncclGroupStart());
    ncclResult_t called = ncclCommInitRankConfig(&comms[r], 2, id, r, &config);
    CHECK((called == ncclSuccess || called == ncclInProgress));
    CHECK(ncclGroupEnd() == ncclInProgress);
    REQUIRE(comms[r] != nullptr);
  }
  CHECK(msSince(t0) < 5000);
  for (ncclComm_t c : comms) CHECK(waitAsync(c) == ncclSuccess);
  std::vector<float> in[2] = {std::vector<float>(64, 1.f), std::vector<float>(64, 2.f)};
  std::vector<float> out[2] = {std::vector<float>(64), std::vector<float>(64)};
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    CHECK(ncclAllReduce(in[r].data(), out[r].data(), 64, ncclFloat, ncclSum, comms[r], nullptr) != ncclInvalidUsage);
  CHECK(ncclGroupEnd() == ncclInProgress);
  for (ncclComm_t c : comms) CHECK(waitAsync(c) == ncclSuccess);
  CHECK(out[0][63] == 3.f);
  CHECK(out[1][0] == 3.f);
  for (ncclComm_t c : comms) NCCL_OK(ncclCommDestroy(c));
}

TEST_CASE("one-rank communicators do every collective as a copy", "[api]") {
  World w(1);
  const TypeInfo& t = typeOf(ncclFloat32);
  Buf s(t, 1000), d(t, 1000);
  s.fill([](size_t i) { return val(0, i); });
  auto same = [](size_t i) { return val(0, i); };
  NCCL_OK(ncclAllReduce(s.at(), d.at(), 1000, ncclFloat, ncclSum, w[0], nullptr));
  checkBuf(d, same, "AllReduce n=1");
  Buf d2(t, 1000);
  NCCL_OK(ncclBroadcast(s.at(), d2.at(), 1000, ncclFloat, 0, w[0], nullptr));
  checkBuf(d2, same, "Broadcast n=1");
  Buf d3(t, 1000);
  NCCL_OK(ncclReduce(s.at(), d3.at(), 1000, ncclFloat, ncclMax, 0, w[0], nullptr));
  checkBuf(d3, same, "Reduce n=1");
  Buf d4(t, 1000);
  NCCL_OK(ncclAllGather(s.at(), d4.at(), 1000, ncclFloat, w[0], nullptr));
  checkBuf(d4, same, "AllGather n=1");
  Buf d5(t, 1000);
  NCCL_OK(ncclReduceScatter(s.at(), d5.at(), 1000, ncclFloat, ncclSum, w[0], nullptr));
  checkBuf(d5, same, "ReduceScatter n=1");
  Buf d6(t, 1000);
  NCCL_OK(ncclAlltoAll(s.at(), d6.at(), 1000, ncclFloat, w[0], nullptr));
  checkBuf(d6, same, "AlltoAll n=1");
  Buf d7(t, 1000);
  NCCL_OK(ncclGather(s.at(), d7.at(), 1000, ncclFloat, 0, w[0], nullptr));
  checkBuf(d7, same, "Gather n=1");
  Buf d8(t, 1000);
  NCCL_OK(ncclScatter(s.at(), d8.at(), 1000, ncclFloat, 0, w[0], nullptr));
  checkBuf(d8, same, "Scatter n=1");
  Buf d9(t, 1000);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(s.at(), 1000, ncclFloat, 0, w[0], nullptr));
  NCCL_OK(ncclRecv(d9.at(), 1000, ncclFloat, 0, w[0], nullptr));
  NCCL_OK(ncclGroupEnd());
  checkBuf(d9, same, "self send/recv n=1");
  Buf ip(t, 1000);
  ip.fill(same);
  NCCL_OK(ncclAllReduce(ip.at(), ip.at(), 1000, ncclFloat, ncclSum, w[0], nullptr));
  checkBuf(ip, same, "in-place AllReduce n=1");
}

TEST_CASE("Finalize then Destroy - Destroy and Abort of NULL - Abort right after init", "[api]") {
  NCCL_OK(ncclCommDestroy(nullptr));
  NCCL_OK(ncclCommAbort(nullptr));
  {
    World w(3);
    requireWorking(w);
    for (int r = 0; r < 3; ++r) NCCL_OK(ncclCommFinalize(w[r]));
    for (int r = 0; r < 3; ++r) {
      ncclResult_t async = ncclInternalError;
      NCCL_OK(ncclCommGetAsyncError(w[r], &async));
      CHECK(async == ncclSuccess);
    }
    for (int r = 0; r < 3; ++r) {
      NCCL_OK(ncclCommDestroy(w[r]));
      w.release(r);
    }
  }
  {
    World w(3);
    auto t0 = Clock::now();
    for (int r = 0; r < 3; ++r) {
      NCCL_OK(ncclCommAbort(w[r]));
      w.release(r);
    }
    CHECK(msSince(t0) < 5000);
  }
  {  // abort after some work
    World w(2);
    requireWorking(w);
    for (int r = 0; r < 2; ++r) {
      NCCL_OK(ncclCommAbort(w[r]));
      w.release(r);
    }
  }
}

// Threads of this process now (/proc/self/task); -1 where that is unreadable.
int threadCount() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(dir))
    if (e->d_name[0] != '.') ++n;
  ::closedir(dir);
  return n;
}

// Waits up to 10 s for the thread count to come back to `want` (a joined
// thread leaves /proc a moment after join returns; on a loaded 2-core
// machine that moment can be long); returns the last count. Only a wrong
// count takes the whole wait.
int threadCountSettlingAt(int want) {
  auto t0 = Clock::now();
  int n = threadCount();
  while (n != want && msSince(t0) < 10000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = threadCount();
  }
  return n;
}

// The thread count once it has held still for 200 ms (at most 10 s): threads
// that set-up joined, ncclCommInitAll's among them, can linger in /proc for a
// while on a loaded machine, and a baseline taken then would count them.
int settledThreadCount() {
  auto t0 = Clock::now();
  int n = threadCount();
  auto stillSince = Clock::now();
  while (msSince(stillSince) < 200 && msSince(t0) < 10000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    int now = threadCount();
    if (now != n) {
      n = now;
      stillSince = Clock::now();
    }
  }
  return n;
}

// Starts what the library starts once per process (engine, transports,
// bootstrap root), so that thread counts taken afterwards see only per-comm threads.
void warmUpLibrary() {
  ncclUniqueId id = newId();
  ncclComm_t solo = nullptr;
  NCCL_OK(ncclCommInitRank(&solo, 1, id, 0));
  NCCL_OK(ncclCommDestroy(solo));
}

TEST_CASE("ncclCommAbort of a nonblocking comm still initializing returns promptly", "[api]") {
  warmUpLibrary();
  ncclUniqueId id = newId();
  const int threadsBefore = settledThreadCount();
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = nullptr;
  // Rank 1 of 2 never arrives, so init cannot finish.
  ncclResult_t rc = ncclCommInitRankConfig(&comm, 2, id, 0, &cfg);
  CHECK(rc == ncclInProgress);
  REQUIRE(comm != nullptr);
  // Off the 100 ms rhythm of the init's waits, so the abort lands mid-wait.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ncclResult_t state = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comm, &state));
  CHECK(state == ncclInProgress);
  // As NCCL: destroy does not wait for the init (it would until the set-up
  // deadline); it fails at once, naming the way out, and the handle lives.
  auto t0 = Clock::now();
  NCCL_EXPECT(ncclCommDestroy(comm), ncclInvalidArgument);
  CHECK(msSince(t0) < 1000);
  CHECK(lastError().find("is still initializing") != std::string::npos);
  CHECK(lastError().find("ncclCommAbort") != std::string::npos);
  NCCL_OK(ncclCommGetAsyncError(comm, &state));
  CHECK(state == ncclInProgress);
  t0 = Clock::now();
  NCCL_OK(ncclCommAbort(comm));
  double abortMs = msSince(t0);
  INFO("ncclCommAbort took " << abortMs << " ms");
  CHECK(abortMs < 2000);
  // The init thread was cancelled and joined, not left waiting for rank 1.
  if (threadsBefore > 0) CHECK(threadCountSettlingAt(threadsBefore) == threadsBefore);
  // The library still works.
  ncclUniqueId again = newId();
  ncclComm_t solo = nullptr;
  NCCL_OK(ncclCommInitRank(&solo, 1, again, 0));
  NCCL_OK(ncclCommDestroy(solo));
}

TEST_CASE("ncclCommAbort of a nonblocking split still initializing returns promptly", "[api][split]") {
  World w(2);
  const int threadsBefore = settledThreadCount();
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t child = nullptr;
  // Rank 1 of the parent never splits, so the split cannot finish.
  ncclResult_t rc = ncclCommSplit(w[0], 0, 0, &child, &cfg);
  CHECK(rc == ncclInProgress);
  REQUIRE(child != nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ncclResult_t state = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(child, &state));
  CHECK(state == ncclInProgress);
  auto t0 = Clock::now();
  NCCL_OK(ncclCommAbort(child));
  double abortMs = msSince(t0);
  INFO("ncclCommAbort took " << abortMs << " ms");
  CHECK(abortMs < 2000);
  if (threadsBefore > 0) CHECK(threadCountSettlingAt(threadsBefore) == threadsBefore);
}

// A split that gives up while it waits for its turn behind an earlier one
// never runs the exchange its peers run over the parent: the parent's later
// splits on that rank fail at once, naming why, instead of pairing with the
// wrong exchanges of its peers.
TEST_CASE("a nonblocking split aborted while it waits for its turn fails the parent's later splits",
          "[api][split][nonblocking]") {
  World w(2);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t first = nullptr, second = nullptr;
  // Rank 1 never splits: the first waits for it, the second for the first.
  CHECK(ncclCommSplit(w[0], 0, 0, &first, &cfg) == ncclInProgress);
  CHECK(ncclCommSplit(w[0], 0, 0, &second, &cfg) == ncclInProgress);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  NCCL_OK(ncclCommAbort(second));
  NCCL_OK(ncclCommAbort(first));
  ncclComm_t third = nullptr;
  const auto t0 = Clock::now();
  CHECK(ncclCommSplit(w[0], 0, 0, &third, nullptr) == ncclInvalidUsage);
  CHECK(msSince(t0) < 2000);
  CHECK(third == nullptr);
  CHECK(lastError().find("an earlier set-up call gave up before its exchange") != std::string::npos);
}

// Detached work (nonblocking communicators, host streams, nonblocking
// groups) is pumped by the process's one progress thread: however many
// operations run, the thread count stays what it was after the first.
TEST_CASE("detached operations share one progress thread per process", "[api][nonblocking]") {
  warmUpLibrary();
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t nb = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&nb, 1, newId(), 0, &cfg);
  REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
  REQUIRE(waitAsync(nb) == ncclSuccess);
  ncclComm_t blocking = nullptr;
  NCCL_OK(ncclCommInitRank(&blocking, 1, newId(), 0));
  shoalHostStream_t hs = nullptr;
  NCCL_OK(shoalHostStreamCreate(&hs));

  std::vector<float> send(64), recv(64, 0.0f);
  int threadsAfterFirst = -1;
  const int rounds = 300;
  for (int i = 0; i < rounds; ++i) {
    std::fill(send.begin(), send.end(), static_cast<float>(i));
    // Nonblocking, alone and in a group.
    rc = ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, nb, nullptr);
    REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
    REQUIRE(waitAsync(nb) == ncclSuccess);
    REQUIRE(recv[63] == static_cast<float>(i));
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclBroadcast(send.data(), recv.data(), send.size(), ncclFloat, 0, nb, nullptr));
    rc = ncclGroupEnd();
    REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
    REQUIRE(waitAsync(nb) == ncclSuccess);
    // A host stream on a blocking communicator.
    NCCL_OK(ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, blocking,
                          reinterpret_cast<cudaStream_t>(hs)));
    NCCL_OK(shoalHostStreamSynchronize(hs));
    REQUIRE(recv[0] == static_cast<float>(i));
    if (i == 0) threadsAfterFirst = settledThreadCount();
  }
  const int threadsAfterAll = threadCountSettlingAt(threadsAfterFirst);
  INFO("threads after the first round " << threadsAfterFirst << ", after " << rounds << ": "
                                        << threadsAfterAll);
  REQUIRE(threadsAfterFirst > 0);
  CHECK(threadsAfterAll == threadsAfterFirst);
  NCCL_OK(shoalHostStreamDestroy(hs));
  NCCL_OK(ncclCommDestroy(blocking));
  NCCL_OK(ncclCommDestroy(nb));
}

TEST_CASE("ncclCommAbort from another thread ends a blocking collective and waits for it to leave",
          "[api]") {
  World w(2);
  std::vector<float> buf(1024, 1.0f);
  std::atomic<bool> started{false};
  std::atomic<bool> returned{false};
  ncclResult_t rc = ncclSuccess;
  std::string error;
  // Rank 0 waits in the AllReduce: rank 1 never calls it.
  std::thread caller([&] {
    started.store(true);
    rc = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, w[0], nullptr);
    error = ncclGetLastError(nullptr);
    returned.store(true);
  });
  while (!started.load()) std::this_thread::yield();
  // Abort only once the call is inside (CommCall's mark): a handle freed
  // before the call reads it would be the test's own use-after-free.
  auto waitStart = Clock::now();
  while (w[0]->shared->callsInside.load() == 0 && msSince(waitStart) < 5000)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(w[0]->shared->callsInside.load() == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(returned.load());
  auto t0 = Clock::now();
  NCCL_OK(ncclCommAbort(w[0]));  // frees the communicator only once the call has left it
  w.release(0);
  double abortMs = msSince(t0);
  caller.join();
  INFO("ncclCommAbort took " << abortMs << " ms; the call said: " << error);
  CHECK(abortMs < 5000);
  CHECK(rc != ncclSuccess);
  CHECK(mentions(error, "aborted"));
  // The other rank is unaffected and can still go away cleanly.
  NCCL_OK(ncclCommDestroy(w[1]));
  w.release(1);
}

// NCCL forbids destroying a communicator while another thread is inside a
// call on it, and destroy does not abort that call: it gives the call a
// second to leave, then returns keeping the handle's memory (which the call
// still uses) rather than wait with it for good.
TEST_CASE("ncclCommDestroy while a call on another thread stays inside returns, keeping the handle",
          "[api]") {
  // The stuck call ends by itself at this deadline, after the destroy.
  shoal::testing::ScopedEnv env{{"SHOAL_PROGRESS_TIMEOUT_MS", "6000"}};
  World w(2);
  std::vector<float> buf(1024, 1.0f);
  std::atomic<bool> returned{false};
  ncclResult_t rc = ncclSuccess;
  std::thread caller([&] {  // rank 1 never calls: rank 0 waits inside
    rc = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, w[0], nullptr);
    returned.store(true);
  });
  auto waitStart = Clock::now();
  while (w[0]->shared->callsInside.load() == 0 && msSince(waitStart) < 5000)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(w[0]->shared->callsInside.load() == 1);
  auto t0 = Clock::now();
  const ncclResult_t destroyed = ncclCommDestroy(w[0]);
  const double destroyMs = msSince(t0);
  INFO("ncclCommDestroy returned " << ncclGetErrorString(destroyed) << " after " << destroyMs << " ms");
  CHECK(destroyMs < 4000);  // 1 s for the call to leave, then the handle is kept
  CHECK_FALSE(returned.load());
  // The kept handle stays valid for the call still inside: it ends at its
  // deadline and reads the communicator meanwhile (ASan would see freed memory).
  caller.join();
  CHECK(rc == ncclRemoteError);
  static ncclComm_t kept = w[0];  // kept for the process's life: no leak report
  (void)kept;
  w.release(0);
  NCCL_OK(ncclCommDestroy(w[1]));
  w.release(1);
}

TEST_CASE("ncclCommAbort from another thread ends an init that ncclGroupEnd runs", "[api][group]") {
  ncclUniqueId id = newId();
  std::atomic<ncclComm_t> handle{nullptr};
  ncclResult_t endRc = ncclSuccess;
  std::string endError;
  // Inside a group, init runs in ncclGroupEnd, which blocks: rank 1 of 2 never arrives.
  std::thread initializer([&] {
    ncclComm_t comm = nullptr;
    if (ncclGroupStart() != ncclSuccess) return;
    ncclResult_t rc = ncclCommInitRank(&comm, 2, id, 0);
    if (rc == ncclSuccess) handle.store(comm);
    endRc = ncclGroupEnd();
    if (endRc != ncclSuccess) endError = lastError();
  });
  auto t0 = Clock::now();
  while (handle.load() == nullptr && msSince(t0) < 5000)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ncclComm_t comm = handle.load();
  if (comm == nullptr) {
    initializer.join();
    FAIL("ncclCommInitRank inside the group did not hand out a communicator");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  t0 = Clock::now();
  NCCL_OK(ncclCommAbort(comm));
  initializer.join();  // ncclGroupEnd returned: the init gave up
  double endedMs = msSince(t0);
  INFO("ncclGroupEnd ended " << endedMs << " ms after ncclCommAbort: " << endError);
  CHECK(endedMs < 2000);
  CHECK(endRc != ncclSuccess);
  CHECK(mentions(endError, "aborted"));
}

// ===========================================================================
// AllReduce: every operator and every type, 1-4 ranks
// ===========================================================================

TEST_CASE("AllReduce sum/prod/max/min/avg of all 12 types at 1 to 4 ranks", "[api][allreduce]") {
  for (int n = 1; n <= 4; ++n) {
    World w(n);
    const bool pow2 = (n & (n - 1)) == 0;
    for (const TypeInfo& t : allTypes()) {
      for (int op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
        for (size_t count : {size_t{1}, size_t{1031}}) {
          INFO("nranks " << n << " type " << t.name << " op " << opName(op) << " count " << count);
          std::vector<Buf> send, recv;
          for (int r = 0; r < n; ++r) {
            send.emplace_back(t, count);
            recv.emplace_back(t, count);
            send[r].fill([&](size_t i) { return inputFor(op, t, r, i); });
          }
          grouped(n, [&](int r) {
            return ncclAllReduce(send[r].at(), recv[r].at(), count, t.type,
                                 static_cast<ncclRedOp_t>(op), w[r], nullptr);
          });
          // Floating avg with a non-power-of-2 rank count pre-multiplies by an
          // inexact 1/n: allow a few units of roundoff.
          for (int r = 0; r < n; ++r) {
            auto want = [&](size_t i) { return expectedFor(op, t, n, i); };
            double tol = (op == ncclAvg && t.floating && !pow2) ? 4 * t.eps * 2.0 * n : 0;
            checkBuf(recv[r], want, "rank " + std::to_string(r), tol);
          }
        }
      }
    }
  }
}

TEST_CASE("AllReduce in place - count 0 and large counts", "[api][allreduce]") {
  for (int n = 2; n <= 4; ++n) {
    World w(n);
    INFO("nranks " << n);
    const TypeInfo& t = typeOf(ncclFloat32);
    const size_t N = 300007;  // > 1 MiB, odd
    std::vector<Buf> buf;
    for (int r = 0; r < n; ++r) {
      buf.emplace_back(t, N);
      buf[r].fill([r](size_t i) { return val(r, i); });
    }
    grouped(n, [&](int r) {
      return ncclAllReduce(buf[r].at(), buf[r].at(), N, ncclFloat, ncclSum, w[r], nullptr);
    });
    for (int r = 0; r < n; ++r)
      checkBuf(buf[r], [n](size_t i) {
        double s = 0;
        for (int q = 0; q < n; ++q) s += val(q, i);
        return s;
      }, "in-place AllReduce");
    // count 0 with NULL buffers: a no-op that succeeds, inside a group...
    grouped(n, [&](int r) { return ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, w[r], nullptr); });
    // ...and outside one, on a single rank (NCCL discards zero-count collectives).
    auto t0 = Clock::now();
    NCCL_OK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, w[0], nullptr));
    NCCL_OK(ncclBroadcast(nullptr, nullptr, 0, ncclFloat, 0, w[0], nullptr));
    NCCL_OK(ncclAllGather(nullptr, nullptr, 0, ncclFloat, w[0], nullptr));
    NCCL_OK(ncclReduceScatter(nullptr, nullptr, 0, ncclFloat, ncclSum, w[0], nullptr));
    NCCL_OK(ncclReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, 0, w[0], nullptr));
    NCCL_OK(ncclAlltoAll(nullptr, nullptr, 0, ncclFloat, w[0], nullptr));
    NCCL_OK(ncclGather(nullptr, nullptr, 0, ncclFloat, 0, w[0], nullptr));
    NCCL_OK(ncclScatter(nullptr, nullptr, 0, ncclFloat, 0, w[0], nullptr));
    CHECK(msSince(t0) < 2000);
    requireWorking(w);
  }
}

TEST_CASE("PreMulSum: host-immediate and device scalars - destroyed right after the call", "[api][allreduce]") {
  for (int n = 1; n <= 4; ++n) {
    World w(n);
    for (const TypeInfo& t : allTypes()) {
      for (ncclScalarResidence_t res : {ncclScalarHostImmediate, ncclScalarDevice}) {
        const size_t count = 517;
        INFO("nranks " << n << " type " << t.name << " residence "
                       << (res == ncclScalarDevice ? "device" : "host-immediate"));
        std::vector<Buf> send, recv, scalar;
        for (int r = 0; r < n; ++r) {
          send.emplace_back(t, count);
          recv.emplace_back(t, count);
          scalar.emplace_back(t, 1);
          send[r].fill([&](size_t i) { return inputFor(-1, t, r, i); });
          scalar[r].set(0, preMulScalar(r));
        }
        // nccl-tests' pattern: create per comm inside the group, enqueue,
        // destroy at once (before ncclGroupEnd).
        grouped(n, [&](int r) {
          ncclRedOp_t op;
          ncclResult_t rc = ncclRedOpCreatePreMulSum(&op, scalar[r].at(), t.type, res, w[r]);
          if (rc != ncclSuccess) return rc;
          CHECK(static_cast<int>(op) >= static_cast<int>(ncclNumOps));
          rc = ncclAllReduce(send[r].at(), recv[r].at(), count, t.type, op, w[r], nullptr);
          if (rc != ncclSuccess) return rc;
          return ncclRedOpDestroy(op, w[r]);
        });
        for (int r = 0; r < n; ++r)
          checkBuf(recv[r], [&](size_t i) { return expectedFor(-1, t, n, i); },
                   "rank " + std::to_string(r));
      }
    }
    // Also outside a group (one rank) and with ReduceScatter/Reduce.
    if (n == 1) {
      const TypeInfo& t = typeOf(ncclFloat32);
      float scalarValue = 3.0f;
      ncclRedOp_t op;
      NCCL_OK(ncclRedOpCreatePreMulSum(&op, &scalarValue, ncclFloat, ncclScalarHostImmediate, w[0]));
      scalarValue = 100.0f;  // host-immediate: read at creation, not later
      Buf s(t, 10), d(t, 10);
      s.fill([](size_t i) { return static_cast<double>(i); });
      NCCL_OK(ncclReduce(s.at(), d.at(), 10, ncclFloat, op, 0, w[0], nullptr));
      NCCL_OK(ncclRedOpDestroy(op, w[0]));
      checkBuf(d, [](size_t i) { return 3.0 * static_cast<double>(i); }, "PreMulSum host-immediate");
    }
  }
}

TEST_CASE("PreMulSum and RedOpDestroy misuse", "[api][errors]") {
  World w(2);
  float scalar = 2.0f;
  ncclRedOp_t op;
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, w[0]));
  std::vector<double> s(8, 1.0), d(8, 0.0);
  // The op belongs to (w[0], float): another datatype is an invalid argument.
  NCCL_EXPECT(ncclAllReduce(s.data(), d.data(), 8, ncclDouble, op, w[0], nullptr), ncclInvalidArgument);
  INFO(lastError());
  CHECK(lastError().find("was created for float and cannot be used with double") != std::string::npos);
  // With count 0 too (NCCL drops the call before it compares the types).
  NCCL_EXPECT(ncclAllReduce(s.data(), d.data(), 0, ncclDouble, op, w[0], nullptr), ncclInvalidArgument);
  NCCL_EXPECT(ncclRedOpDestroy(ncclSum, w[0]), ncclInvalidArgument);
  NCCL_EXPECT(ncclRedOpDestroy(ncclAvg, w[0]), ncclInvalidArgument);
  NCCL_OK(ncclRedOpDestroy(op, w[0]));
  NCCL_EXPECT(ncclRedOpDestroy(op, w[0]), ncclInvalidArgument);  // already destroyed
  NCCL_EXPECT(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, nullptr),
              ncclInvalidArgument);
  NCCL_EXPECT(ncclRedOpCreatePreMulSum(&op, &scalar, static_cast<ncclDataType_t>(ncclNumTypes),
                                       ncclScalarHostImmediate, w[0]),
              ncclInvalidArgument);
  requireWorking(w);
}

// ===========================================================================
// Data movement collectives, every root, in place with NCCL's offsets
// ===========================================================================

TEST_CASE("Broadcast and Bcast: every root - in place - NULL sendbuff on non-roots", "[api][coll]") {
  for (ncclDataType_t dt : {ncclFloat32, ncclUint8}) {
    const TypeInfo& t = typeOf(dt);
    for (int n = 1; n <= 4; ++n) {
      World w(n);
      const size_t N = 10007;
      for (int root = 0; root < n; ++root) {
        INFO("type " << t.name << " nranks " << n << " root " << root);
        std::vector<Buf> send, recv, inplace, legacy;
        for (int r = 0; r < n; ++r) {
          send.emplace_back(t, N);
          recv.emplace_back(t, N);
          inplace.emplace_back(t, N);
          legacy.emplace_back(t, N);
          send[r].fill([r](size_t i) { return val(r, i); });
          inplace[r].fill([r](size_t i) { return val(r, i); });
          legacy[r].fill([r](size_t i) { return val(r, i); });
        }
        grouped(n, [&](int r) {
          return ncclBroadcast(r == root ? send[r].at() : nullptr, recv[r].at(), N, dt, root, w[r],
                               nullptr);
        });
        grouped(n, [&](int r) {
          return ncclBroadcast(inplace[r].at(), inplace[r].at(), N, dt, root, w[r], nullptr);
        });
        grouped(n, [&](int r) { return ncclBcast(legacy[r].at(), N, dt, root, w[r], nullptr); });
        auto want = [root](size_t i) { return val(root, i); };
        for (int r = 0; r < n; ++r) {
          checkBuf(recv[r], want, "Broadcast rank " + std::to_string(r));
          checkBuf(inplace[r], want, "in-place Broadcast rank " + std::to_string(r));
          checkBuf(legacy[r], want, "ncclBcast rank " + std::to_string(r));
        }
      }
    }
  }
}

TEST_CASE("Reduce: every root - NULL recvbuff on non-roots - in place at the root", "[api][coll]") {
  for (ncclDataType_t dt : {ncclFloat32, ncclUint8}) {
    const TypeInfo& t = typeOf(dt);
    for (int n = 1; n <= 4; ++n) {
      World w(n);
      const size_t N = 5003;
      for (int root = 0; root < n; ++root) {
        for (int op : {ncclSum, ncclMax}) {
          INFO("type " << t.name << " nranks " << n << " root " << root << " op " << opName(op));
          std::vector<Buf> send, inplace;
          Buf recv(t, N);
          for (int r = 0; r < n; ++r) {
            send.emplace_back(t, N);
            inplace.emplace_back(t, N);
            send[r].fill([r](size_t i) { return val(r, i); });
            inplace[r].fill([r](size_t i) { return val(r, i); });
          }
          grouped(n, [&](int r) {
            return ncclReduce(send[r].at(), r == root ? recv.at() : nullptr, N, dt,
                              static_cast<ncclRedOp_t>(op), root, w[r], nullptr);
          });
          grouped(n, [&](int r) {
            return ncclReduce(inplace[r].at(), inplace[r].at(), N, dt, static_cast<ncclRedOp_t>(op),
                              root, w[r], nullptr);
          });
          auto want = [n, op](size_t i) {
            double acc = op == ncclSum ? 0 : -1;
            for (int q = 0; q < n; ++q) acc = op == ncclSum ? acc + val(q, i) : std::max(acc, val(q, i));
            return acc;
          };
          checkBuf(recv, want, "Reduce");
          checkBuf(inplace[root], want, "in-place Reduce at the root");
          for (int r = 0; r < n; ++r) {  // non-roots' send buffers are not written
            if (r == root) continue;
            checkBuf(send[r], [r](size_t i) { return val(r, i); }, "non-root sendbuff unchanged");
          }
        }
      }
    }
  }
}

TEST_CASE("AllGather and ReduceScatter - out of place and in place", "[api][coll]") {
  for (ncclDataType_t dt : {ncclFloat32, ncclUint8}) {
    const TypeInfo& t = typeOf(dt);
    for (int n = 1; n <= 4; ++n) {
      World w(n);
      for (size_t N : {size_t{1}, size_t{4099}}) {
        INFO("type " << t.name << " nranks " << n << " count " << N);
        // AllGather: rank r's block lands at r*N.
        std::vector<Buf> send, recv, inplace;
        for (int r = 0; r < n; ++r) {
          send.emplace_back(t, N);
          recv.emplace_back(t, N * n);
          inplace.emplace_back(t, N * n);
          send[r].fill([r](size_t i) { return val(r, i); });
          inplace[r].fill([](size_t) { return 99; });
          for (size_t i = 0; i < N; ++i) inplace[r].set(r * N + i, val(r, i));
        }
        grouped(n, [&](int r) { return ncclAllGather(send[r].at(), recv[r].at(), N, dt, w[r], nullptr); });
        grouped(n, [&](int r) {
          return ncclAllGather(inplace[r].at(r * N), inplace[r].at(), N, dt, w[r], nullptr);
        });
        auto gathered = [N](size_t j) { return val(static_cast<int>(j / N), j % N); };
        for (int r = 0; r < n; ++r) {
          checkBuf(recv[r], gathered, "AllGather rank " + std::to_string(r));
          checkBuf(inplace[r], gathered, "in-place AllGather rank " + std::to_string(r));
        }
        // ReduceScatter: rank r gets the sum of block r.
        std::vector<Buf> rsSend, rsRecv, rsInplace;
        for (int r = 0; r < n; ++r) {
          rsSend.emplace_back(t, N * n);
          rsRecv.emplace_back(t, N);
          rsInplace.emplace_back(t, N * n);
          rsSend[r].fill([r](size_t j) { return val(r, j); });
          rsInplace[r].fill([r](size_t j) { return val(r, j); });
        }
        grouped(n, [&](int r) {
          return ncclReduceScatter(rsSend[r].at(), rsRecv[r].at(), N, dt, ncclSum, w[r], nullptr);
        });
        grouped(n, [&](int r) {
          return ncclReduceScatter(rsInplace[r].at(), rsInplace[r].at(r * N), N, dt, ncclSum, w[r], nullptr);
        });
        for (int r = 0; r < n; ++r) {
          auto want = [n, r, N](size_t i) {
            double s = 0;
            for (int q = 0; q < n; ++q) s += val(q, r * N + i);
            return s;
          };
          checkBuf(rsRecv[r], want, "ReduceScatter rank " + std::to_string(r));
          for (size_t i = 0; i < N; ++i) {
            if (rsInplace[r].get(r * N + i) != want(i)) {
              FAIL_CHECK("in-place ReduceScatter rank " << r << " element " << i << " is "
                                                  << rsInplace[r].get(r * N + i) << ", expected " << want(i));
              break;
            }
          }
        }
      }
    }
  }
}

TEST_CASE("AlltoAll and Gather and Scatter: every root - in place at the root", "[api][coll]") {
  for (ncclDataType_t dt : {ncclFloat32, ncclUint8}) {
    const TypeInfo& t = typeOf(dt);
    for (int n = 1; n <= 4; ++n) {
      World w(n);
      const size_t N = 3001;
      INFO("type " << t.name << " nranks " << n);
      {  // AlltoAll: block j of rank r goes to rank j at r*N
        std::vector<Buf> send, recv;
        for (int r = 0; r < n; ++r) {
          send.emplace_back(t, N * n);
          recv.emplace_back(t, N * n);
          send[r].fill([r](size_t j) { return val(r, j); });
        }
        grouped(n, [&](int r) { return ncclAlltoAll(send[r].at(), recv[r].at(), N, dt, w[r], nullptr); });
        for (int r = 0; r < n; ++r)
          checkBuf(recv[r], [r, N](size_t j) { return val(static_cast<int>(j / N), r * N + j % N); },
                   "AlltoAll rank " + std::to_string(r));
      }
      for (int root = 0; root < n; ++root) {
        INFO("root " << root);
        // Gather: out of place (non-roots pass NULL recvbuff) and in place at the root.
        std::vector<Buf> send;
        Buf recv(t, N * n), inplace(t, N * n);
        for (int r = 0; r < n; ++r) {
          send.emplace_back(t, N);
          send[r].fill([r](size_t i) { return val(r, i); });
        }
        inplace.fill([](size_t) { return 77; });
        for (size_t i = 0; i < N; ++i) inplace.set(root * N + i, val(root, i));
        grouped(n, [&](int r) {
          return ncclGather(send[r].at(), r == root ? recv.at() : nullptr, N, dt, root, w[r], nullptr);
        });
        grouped(n, [&](int r) {
          return r == root ? ncclGather(inplace.at(root * N), inplace.at(), N, dt, root, w[r], nullptr)
                           : ncclGather(send[r].at(), nullptr, N, dt, root, w[r], nullptr);
        });
        auto gathered = [N](size_t j) { return val(static_cast<int>(j / N), j % N); };
        checkBuf(recv, gathered, "Gather");
        checkBuf(inplace, gathered, "in-place Gather");
        // Scatter: out of place (non-roots pass NULL sendbuff) and in place at the root.
        Buf scatterSend(t, N * n), scatterInplace(t, N * n);
        scatterSend.fill([root](size_t j) { return val(root, j); });
        scatterInplace.fill([root](size_t j) { return val(root, j); });
        std::vector<Buf> out;
        for (int r = 0; r < n; ++r) out.emplace_back(t, N);
        grouped(n, [&](int r) {
          return ncclScatter(r == root ? scatterSend.at() : nullptr, out[r].at(), N, dt, root, w[r], nullptr);
        });
        for (int r = 0; r < n; ++r)
          checkBuf(out[r], [root, r, N](size_t i) { return val(root, r * N + i); },
                   "Scatter rank " + std::to_string(r));
        std::vector<Buf> out2;
        for (int r = 0; r < n; ++r) out2.emplace_back(t, N);
        grouped(n, [&](int r) {
          return r == root
                     ? ncclScatter(scatterInplace.at(), scatterInplace.at(root * N), N, dt, root, w[r], nullptr)
                     : ncclScatter(nullptr, out2[r].at(), N, dt, root, w[r], nullptr);
        });
        checkBuf(scatterInplace, [root](size_t j) { return val(root, j); }, "in-place Scatter at the root");
        for (int r = 0; r < n; ++r)
          if (r != root)
            checkBuf(out2[r], [root, r, N](size_t i) { return val(root, r * N + i); },
                     "Scatter (root in place) rank " + std::to_string(r));
      }
    }
  }
}

// ===========================================================================
// Point to point
// ===========================================================================

// A group's operations on one communicator run as one merged plan; its
// buffer numbers are 32 bits, so groups far above what 16 bits held (5,461
// operations) run with the right data: an all-to-all of 3,000 ranks' worth of
// Send/Recv pairs (12,000 operations a rank), then 6,000 AllReduces grouped
// with them on one communicator.
TEST_CASE("a group of 18000 operations per communicator runs whole", "[api][group]") {
  World w(2);
  constexpr size_t kPairs = 6000;  // Send and Recv each, per rank
  std::vector<std::vector<int32_t>> in(2, std::vector<int32_t>(kPairs));
  for (int r = 0; r < 2; ++r)
    for (size_t k = 0; k < kPairs; ++k) in[r][k] = static_cast<int32_t>(r * 1000000 + k);
  for (bool withAllReduces : {false, true}) {
    INFO((withAllReduces ? "Send/Recv pairs and AllReduces" : "Send/Recv pairs"));
    std::vector<std::vector<int32_t>> out(2, std::vector<int32_t>(kPairs, -1)), sums = out;
    grouped(2, [&](int r) {
      for (size_t k = 0; k < kPairs; ++k) {
        ncclResult_t rc = withAllReduces
                              ? ncclAllReduce(&in[r][k], &sums[r][k], 1, ncclInt32, ncclSum, w[r], nullptr)
                              : ncclSuccess;
        if (rc == ncclSuccess) rc = ncclSend(&in[r][k], 1, ncclInt32, 1 - r, w[r], nullptr);
        if (rc == ncclSuccess) rc = ncclRecv(&out[r][k], 1, ncclInt32, 1 - r, w[r], nullptr);
        if (rc != ncclSuccess) return rc;
      }
      return ncclSuccess;
    });
    for (int r = 0; r < 2; ++r) {
      size_t wrong = 0;
      for (size_t k = 0; k < kPairs; ++k)
        wrong += (out[r][k] != in[1 - r][k]) + (withAllReduces && sums[r][k] != in[0][k] + in[1][k]);
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("Send/Recv in groups: ring - self - pairwise - ordering - zero bytes", "[api][p2p]") {
  const TypeInfo& t = typeOf(ncclFloat32);
  for (int n = 1; n <= 4; ++n) {
    World w(n);
    INFO("nranks " << n);
    const size_t N = 20011;
    // Ring shift (n == 1: to self), repeated with new buffers and data: the
    // repeats reuse the group's cached merged plan.
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<Buf> send, recv;
      for (int r = 0; r < n; ++r) {
        send.emplace_back(t, N);
        recv.emplace_back(t, N);
        send[r].fill([r, rep](size_t i) { return val(r + 10 * rep, i); });
      }
      grouped(n, [&](int r) {
        ncclResult_t rc = ncclSend(send[r].at(), N, ncclFloat, (r + 1) % n, w[r], nullptr);
        if (rc != ncclSuccess) return rc;
        return ncclRecv(recv[r].at(), N, ncclFloat, (r + n - 1) % n, w[r], nullptr);
      });
      for (int r = 0; r < n; ++r) {
        int prev = (r + n - 1) % n;
        checkBuf(recv[r], [prev, rep](size_t i) { return val(prev + 10 * rep, i); },
                 "ring rank " + std::to_string(r) + " repeat " + std::to_string(rep));
      }
    }
    {  // self send/recv, recv posted before send
      std::vector<Buf> send, recv;
      for (int r = 0; r < n; ++r) {
        send.emplace_back(t, N);
        recv.emplace_back(t, N);
        send[r].fill([r](size_t i) { return val(r + 3, i); });
      }
      grouped(n, [&](int r) {
        ncclResult_t rc = ncclRecv(recv[r].at(), N, ncclFloat, r, w[r], nullptr);
        if (rc != ncclSuccess) return rc;
        return ncclSend(send[r].at(), N, ncclFloat, r, w[r], nullptr);
      });
      for (int r = 0; r < n; ++r)
        checkBuf(recv[r], [r](size_t i) { return val(r + 3, i); }, "self rank " + std::to_string(r));
    }
    {  // all pairs, three messages per pair in order, plus zero-byte messages
      const size_t M = 1000;
      std::vector<std::vector<Buf>> send(n), recv(n);
      for (int r = 0; r < n; ++r)
        for (int p = 0; p < n; ++p) {
          send[r].emplace_back(t, 3 * M);
          recv[r].emplace_back(t, 3 * M);
          send[r][p].fill([r, p](size_t i) { return val(r * 4 + p, i); });
        }
      grouped(n, [&](int r) {
        for (int p = 0; p < n; ++p) {
          for (int k = 0; k < 3; ++k) {
            ncclResult_t rc = ncclSend(send[r][p].at(k * M), M, ncclFloat, p, w[r], nullptr);
            if (rc != ncclSuccess) return rc;
          }
          ncclResult_t rc = ncclSend(nullptr, 0, ncclFloat, p, w[r], nullptr);
          if (rc != ncclSuccess) return rc;
        }
        for (int p = n - 1; p >= 0; --p) {  // receives in another peer order
          for (int k = 0; k < 3; ++k) {
            ncclResult_t rc = ncclRecv(recv[r][p].at(k * M), M, ncclFloat, p, w[r], nullptr);
            if (rc != ncclSuccess) return rc;
          }
          ncclResult_t rc = ncclRecv(nullptr, 0, ncclFloat, p, w[r], nullptr);
          if (rc != ncclSuccess) return rc;
        }
        return ncclSuccess;
      });
      for (int r = 0; r < n; ++r)
        for (int p = 0; p < n; ++p)
          checkBuf(recv[r][p], [r, p](size_t i) { return val(p * 4 + r, i); },
                   "pair " + std::to_string(p) + " -> " + std::to_string(r));
    }
    {  // collectives and p2p mixed in one group
      if (n >= 2) {
        std::vector<Buf> a, b, s, d;
        for (int r = 0; r < n; ++r) {
          a.emplace_back(t, 100);
          b.emplace_back(t, 100);
          s.emplace_back(t, 100);
          d.emplace_back(t, 100);
          a[r].fill([r](size_t i) { return val(r, i); });
          s[r].fill([r](size_t i) { return val(r + 7, i); });
        }
        grouped(n, [&](int r) {
          ncclResult_t rc = ncclAllReduce(a[r].at(), b[r].at(), 100, ncclFloat, ncclSum, w[r], nullptr);
          if (rc != ncclSuccess) return rc;
          rc = ncclSend(s[r].at(), 100, ncclFloat, (r + 1) % n, w[r], nullptr);
          if (rc != ncclSuccess) return rc;
          return ncclRecv(d[r].at(), 100, ncclFloat, (r + n - 1) % n, w[r], nullptr);
        });
        for (int r = 0; r < n; ++r) {
          checkBuf(b[r], [n](size_t i) {
            double x = 0;
            for (int q = 0; q < n; ++q) x += val(q, i);
            return x;
          }, "mixed group AllReduce");
          int prev = (r + n - 1) % n;
          checkBuf(d[r], [prev](size_t i) { return val(prev + 7, i); }, "mixed group recv");
        }
      }
    }
  }
}

// ===========================================================================
// Groups
// ===========================================================================

TEST_CASE("group nesting: only the outermost ncclGroupEnd runs the operations", "[api][group]") {
  World w(3);
  const TypeInfo& t = typeOf(ncclFloat32);
  std::vector<Buf> send, recv;
  for (int r = 0; r < 3; ++r) {
    send.emplace_back(t, 64);
    recv.emplace_back(t, 64);
    send[r].fill([r](size_t i) { return val(r, i); });
    recv[r].fill([](size_t) { return -5; });
  }
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 3; ++r)
    NCCL_OK(ncclAllReduce(send[r].at(), recv[r].at(), 64, ncclFloat, ncclSum, w[r], nullptr));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < 3; ++r)
    checkBuf(recv[r], [](size_t) { return -5; }, "nothing ran before the outermost ncclGroupEnd");
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < 3; ++r)
    checkBuf(recv[r], [](size_t i) { return val(0, i) + val(1, i) + val(2, i); }, "after the outermost end");
  // ncclGroupEnd without ncclGroupStart
  NCCL_EXPECT(ncclGroupEnd(), ncclInvalidUsage);
  CHECK(mentions(lastError(), "group"));
  requireWorking(w);
}

// As in NCCL, a group is all or nothing on each rank: a call that fails
// inside it (here a bad operator, then a bad type) makes the outermost
// ncclGroupEnd run none of the group and return that error. Running the rest
// would leave this rank's peers, or the rank itself, waiting on half a group.
TEST_CASE("a call that fails inside a group fails the whole group", "[api][group][errors]") {
  World w(2);
  const TypeInfo& t = typeOf(ncclFloat32);
  std::vector<Buf> send, recv;
  for (int r = 0; r < 2; ++r) {
    send.emplace_back(t, 32);
    recv.emplace_back(t, 32);
    send[r].fill([r](size_t i) { return val(r, i); });
    recv[r].fill([](size_t) { return -3; });
  }
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(send[0].at(), recv[0].at(), 32, ncclFloat, ncclSum, w[0], nullptr));
  NCCL_OK(ncclGroupStart());  // nested: only the outermost end decides
  NCCL_EXPECT(ncclAllReduce(send[1].at(), recv[1].at(), 32, ncclFloat,
                            static_cast<ncclRedOp_t>(ncclNumOps + 40), w[1], nullptr),
              ncclInvalidArgument);
  NCCL_OK(ncclGroupEnd());
  NCCL_EXPECT(ncclAllReduce(send[1].at(), recv[1].at(), 32, static_cast<ncclDataType_t>(77), ncclSum,
                            w[1], nullptr),
              ncclInvalidArgument);
  NCCL_OK(ncclAllReduce(send[1].at(), recv[1].at(), 32, ncclFloat, ncclSum, w[1], nullptr));
  NCCL_EXPECT(ncclGroupEnd(), ncclInvalidArgument);
  const std::string why = lastError();
  INFO(why);
  CHECK(why.find("the group was not run, because ncclAllReduce inside it failed") != std::string::npos);
  CHECK(why.find("reduction operator 45 is unknown to this communicator") != std::string::npos);  // the first failure
  for (int r = 0; r < 2; ++r) checkBuf(recv[r], [](size_t) { return -3; }, "a failed group runs nothing");
  NCCL_EXPECT(ncclGroupEnd(), ncclInvalidUsage);  // the group is closed
  // Nothing of it is left behind: one AllReduce per rank now matches, with
  // no stray operation of the failed group merged into rank 0's.
  grouped(2, [&](int r) { return ncclAllReduce(send[r].at(), recv[r].at(), 32, ncclFloat, ncclSum, w[r], nullptr); });
  for (int r = 0; r < 2; ++r)
    checkBuf(recv[r], [](size_t i) { return val(0, i) + val(1, i); }, "the next group");
  // A NULL communicator fails the group too (NCCL's CommCheck does), and so
  // does a revoked one; the group's error is the last failure's code, as in
  // NCCL, and every failure is named.
  ncclComm_t revoked = nullptr;
  NCCL_OK(ncclCommInitRank(&revoked, 1, newId(), 0));
  NCCL_OK(ncclCommRevoke(revoked, NCCL_REVOKE_DEFAULT));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(send[0].at(), recv[0].at(), 32, ncclFloat, ncclSum, w[0], nullptr));
  NCCL_EXPECT(ncclSend(send[1].at(), 32, ncclFloat, 0, nullptr, nullptr), ncclInvalidArgument);
  NCCL_EXPECT(ncclAllReduce(send[1].at(), recv[1].at(), 32, ncclFloat, ncclSum, revoked, nullptr), ncclInvalidUsage);
  NCCL_EXPECT(ncclGroupEnd(), ncclInvalidUsage);
  const std::string both = lastError();
  INFO(both);
  CHECK(both.find("because ncclSend inside it failed") != std::string::npos);
  CHECK(both.find("; then ncclAllReduce failed") != std::string::npos);
  NCCL_OK(ncclCommDestroy(revoked));
  // A shrink that aborts its parent, in a group that fails, never ran: the
  // parent is not aborted.
  NCCL_OK(ncclGroupStart());
  int excluded = 1;
  ncclComm_t shrunk = nullptr;
  NCCL_OK(ncclCommShrink(w[0], &excluded, 1, &shrunk, nullptr, NCCL_SHRINK_ABORT));
  NCCL_EXPECT(ncclSignal(1, 0, 0, 0, w[0], nullptr), ncclInvalidUsage);  // not implemented: fails the group
  NCCL_EXPECT(ncclGroupEnd(), ncclInvalidUsage);
  CHECK(lastError().find("because ncclSignal inside it failed") != std::string::npos);
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(shrunk, &async));
  CHECK(async == ncclInvalidUsage);
  NCCL_OK(ncclCommDestroy(shrunk));
  requireWorking(w);
}

// An init recorded in a group that then fails never runs: its handle, given
// out at the call, reports the group's error and can be destroyed. A
// simulated end runs the inits (as NCCL does) and only estimates operations.
TEST_CASE("inits in a failed group report its error, and a simulated end runs them", "[api][group][errors]") {
  ncclUniqueId id = newId();
  ncclComm_t comm = nullptr;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  REQUIRE(comm != nullptr);
  float x = 1;
  NCCL_EXPECT(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, nullptr, nullptr), ncclInvalidArgument);
  NCCL_EXPECT(ncclGroupEnd(), ncclInvalidArgument);
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclInvalidArgument);
  // A call on it returns its error state, as NCCL's (ncclCommEnsureReady).
  NCCL_EXPECT(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, nullptr), ncclInvalidArgument);
  CHECK(lastError().find("failed to initialize: the group was not run") != std::string::npos);
  NCCL_OK(ncclCommDestroy(comm));

  // A simulated end of a failed group returns its error too.
  comm = nullptr;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommInitRank(&comm, 1, newId(), 0));
  NCCL_EXPECT(ncclBroadcast(&x, &x, 1, ncclFloat, 0, nullptr, nullptr), ncclInvalidArgument);
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  NCCL_EXPECT(ncclGroupSimulateEnd(&info), ncclInvalidArgument);
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclInvalidArgument);
  NCCL_OK(ncclCommDestroy(comm));

  comm = nullptr;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommInitRank(&comm, 1, newId(), 0));
  NCCL_OK(ncclGroupSimulateEnd(&info));
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess);
  x = 5;
  float y = 0;
  NCCL_OK(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, comm, nullptr));
  CHECK(y == 5);
  NCCL_OK(ncclCommDestroy(comm));
}

TEST_CASE("ncclGroupSimulateEnd estimates and runs nothing", "[api][group]") {
  World w(2);
  const TypeInfo& t = typeOf(ncclFloat32);
  std::vector<Buf> send, recv;
  for (int r = 0; r < 2; ++r) {
    send.emplace_back(t, 4096);
    recv.emplace_back(t, 4096);
    send[r].fill([r](size_t i) { return val(r, i); });
    recv[r].fill([](size_t) { return -3; });
  }
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    NCCL_OK(ncclAllReduce(send[r].at(), recv[r].at(), 4096, ncclFloat, ncclSum, w[r], nullptr));
  ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
  bad.magic = 0;
  NCCL_EXPECT(ncclGroupSimulateEnd(&bad), ncclInvalidArgument);
  NCCL_EXPECT(ncclGroupSimulateEnd(nullptr), ncclInvalidArgument);
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  NCCL_OK(ncclGroupSimulateEnd(&info));
  CHECK(info.estimatedTime > 0.0f);
  CHECK(info.estimatedTime != NCCL_UNDEF_FLOAT);
  // The tuner's model: 1000x the bytes costs more time.
  std::vector<float> big(4096 * 1000);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    NCCL_OK(ncclAllReduce(big.data(), big.data(), big.size(), ncclFloat, ncclSum, w[r], nullptr));
  ncclSimInfo_t bigInfo = NCCL_SIM_INFO_INITIALIZER;
  NCCL_OK(ncclGroupSimulateEnd(&bigInfo));
  CHECK(bigInfo.estimatedTime > info.estimatedTime);
  for (int r = 0; r < 2; ++r) checkBuf(recv[r], [](size_t) { return -3; }, "simulation runs nothing");
  NCCL_EXPECT(ncclGroupEnd(), ncclInvalidUsage);  // the simulated group is closed
  requireWorking(w);
}

TEST_CASE("ncclCommInitRank of every rank inside one group from one thread", "[api][group]") {
  // nccl-tests initializes all of its communicators this way (-g N).
  const int n = 3;
  ncclUniqueId id = newId();
  std::vector<ncclComm_t> comms(n, nullptr);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; ++r) NCCL_OK(ncclCommInitRank(&comms[r], n, id, r));
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < n; ++r) {
    REQUIRE(comms[r] != nullptr);
    int rank = -1;
    NCCL_OK(ncclCommUserRank(comms[r], &rank));
    CHECK(rank == r);
  }
  const TypeInfo& t = typeOf(ncclInt32);
  std::vector<Buf> send, recv;
  for (int r = 0; r < n; ++r) {
    send.emplace_back(t, 333);
    recv.emplace_back(t, 333 * n);
    send[r].fill([r](size_t i) { return val(r, i); });
  }
  grouped(n, [&](int r) { return ncclAllGather(send[r].at(), recv[r].at(), 333, ncclInt32, comms[r], nullptr); });
  for (int r = 0; r < n; ++r)
    checkBuf(recv[r], [](size_t j) { return val(static_cast<int>(j / 333), j % 333); }, "AllGather");
  for (auto c : comms) NCCL_OK(ncclCommDestroy(c));
}

// ===========================================================================
// Threads: one rank per thread from one unique id
// ===========================================================================

TEST_CASE("4 threads - one ncclUniqueId - ncclCommInitRank each (loopback)", "[api][threads]") {
  requireNoErrors(runThreads(4, [](int r, ncclComm_t comm) { return threadedCollectives(4, r, comm); }));
}

TEST_CASE("4 threads over tcp on 127.0.0.1 (SHOAL_TRANSPORT=tcp)", "[api][threads][tcp]") {
  const char* before = std::getenv("SHOAL_TRANSPORT");
  std::string saved = before ? before : "";
  ::setenv("SHOAL_TRANSPORT", "tcp", 1);
  ncclResetDebugInit();
  auto errors = runThreads(4, [](int r, ncclComm_t comm) { return threadedCollectives(4, r, comm); });
  if (before) ::setenv("SHOAL_TRANSPORT", saved.c_str(), 1);
  else ::unsetenv("SHOAL_TRANSPORT");
  ncclResetDebugInit();
  requireNoErrors(errors);
}

// A collective grouped with Send/Recv on some ranks and called alone on
// others (NCCL lets ranks group point-to-point calls as they like): every
// rank must run the same algorithm for it, peer-reading ones included
// (SHOAL_ALGO=peer_read makes AllReduce one wherever it may run). Rank 0
// groups it with a Send to rank 1, which calls it alone and then the Recv;
// rank 2 calls it alone. Then every rank groups it with a ring exchange.
std::string collectiveBesidePointToPoint(int n, int r, ncclComm_t comm) {
  const size_t N = 5000;
  auto sum = [&](size_t i) {
    float s = 0;
    for (int q = 0; q < n; ++q) s += static_cast<float>(val(q, i));
    return s;
  };
  std::vector<float> send(N), reduced(N, -1.f), got(N, -1.f);
  for (size_t i = 0; i < N; ++i) send[i] = static_cast<float>(val(r, i));
  for (int round = 0; round < 2; ++round) {
    std::fill(reduced.begin(), reduced.end(), -1.f);
    std::fill(got.begin(), got.end(), -1.f);
    if (r == 0) {
      T_NCCL(ncclGroupStart());
      T_NCCL(ncclAllReduce(send.data(), reduced.data(), N, ncclFloat, ncclSum, comm, nullptr));
      T_NCCL(ncclSend(send.data(), N, ncclFloat, 1, comm, nullptr));
      T_NCCL(ncclGroupEnd());
    } else {
      T_NCCL(ncclAllReduce(send.data(), reduced.data(), N, ncclFloat, ncclSum, comm, nullptr));
      if (r == 1) {
        T_NCCL(ncclRecv(got.data(), N, ncclFloat, 0, comm, nullptr));
        for (size_t i = 0; i < N; ++i) T_CHECK(got[i] == static_cast<float>(val(0, i)), "Recv element " + std::to_string(i));
      }
    }
    for (size_t i = 0; i < N; ++i) T_CHECK(reduced[i] == sum(i), "AllReduce element " + std::to_string(i));
  }
  std::fill(reduced.begin(), reduced.end(), -1.f);
  std::fill(got.begin(), got.end(), -1.f);
  T_NCCL(ncclGroupStart());
  T_NCCL(ncclSend(send.data(), N, ncclFloat, (r + 1) % n, comm, nullptr));
  T_NCCL(ncclAllReduce(send.data(), reduced.data(), N, ncclFloat, ncclSum, comm, nullptr));
  T_NCCL(ncclRecv(got.data(), N, ncclFloat, (r + n - 1) % n, comm, nullptr));
  T_NCCL(ncclGroupEnd());
  for (size_t i = 0; i < N; ++i) T_CHECK(reduced[i] == sum(i), "grouped AllReduce element " + std::to_string(i));
  for (size_t i = 0; i < N; ++i)
    T_CHECK(got[i] == static_cast<float>(val((r + n - 1) % n, i)), "ring element " + std::to_string(i));
  return "";
}

TEST_CASE("a collective grouped with Send/Recv on some ranks and alone on others runs alike on all",
          "[api][threads][group]") {
  for (const char* algo : {"peer_read", ""}) {
    INFO("SHOAL_ALGO=" << algo);
    shoal::testing::ScopedEnv env{{"SHOAL_ALGO", algo}, {"SHOAL_PROGRESS_TIMEOUT_MS", "20000"}};
    requireNoErrors(runThreads(3, [](int r, ncclComm_t comm) { return collectiveBesidePointToPoint(3, r, comm); }));
  }
}

// Every rank passes the same nId ids (PyTorch makes one per 128 ranks, each
// by a different rank, and all-gathers them through its store).
static void initScalableAndRun(int n, const std::vector<ncclUniqueId>& ids) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ncclComm_t comm = nullptr;
      std::vector<ncclUniqueId> mine = ids;  // each rank its own copy, as after a store exchange
      ncclResult_t rc = ncclCommInitRankScalable(&comm, n, r, static_cast<int>(mine.size()), mine.data(), nullptr);
      if (rc != ncclSuccess) {
        errors[r] = std::string("init: ") + ncclGetErrorString(rc) + ": " + lastError();
        return;
      }
      errors[r] = threadedCollectives(n, r, comm);
      (void)ncclCommDestroy(comm);
    });
  for (auto& t : threads) t.join();
  requireNoErrors(errors);
}

TEST_CASE("ncclCommInitRankScalable with one id from 3 threads", "[api][threads]") {
  initScalableAndRun(3, {newId()});
}

TEST_CASE("ncclCommInitRankScalable with three ids, each made separately, from 4 threads", "[api][threads]") {
  initScalableAndRun(4, {newId(), newId(), newId()});
}

TEST_CASE("ncclCommInitRankScalable: nId < 1 or a NULL array is an invalid argument", "[api]") {
  ncclComm_t comm = nullptr;
  ncclUniqueId id = newId();
  REQUIRE(ncclCommInitRankScalable(&comm, 1, 0, 0, &id, nullptr) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(nullptr)).find("nId 0") != std::string::npos);
  REQUIRE(ncclCommInitRankScalable(&comm, 1, 0, 1, nullptr, nullptr) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(nullptr)).find("commIds") != std::string::npos);
  CHECK(comm == nullptr);
}

TEST_CASE("ncclCommGetAsyncError from a watchdog thread while collectives run", "[api][threads]") {
  // PyTorch's watchdog polls ncclCommGetAsyncError from its own thread while
  // the main thread enqueues work.
  World w(2);
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, polls{0};
  std::thread watchdog([&] {
    while (!stop.load()) {
      for (int r = 0; r < 2; ++r) {
        ncclResult_t state = ncclInternalError;
        if (ncclCommGetAsyncError(w[r], &state) != ncclSuccess || state != ncclSuccess) ++bad;
        ++polls;
      }
      std::this_thread::yield();
    }
  });
  const TypeInfo& t = typeOf(ncclFloat32);
  std::vector<Buf> send, recv;
  for (int r = 0; r < 2; ++r) {
    send.emplace_back(t, 4099);
    recv.emplace_back(t, 4099);
    send[r].fill([r](size_t i) { return val(r, i); });
  }
  auto t0 = Clock::now();
  while (polls.load() == 0 && msSince(t0) < 5000) std::this_thread::yield();
  for (int it = 0; it < 200 || (polls.load() < 100 && msSince(t0) < 10000); ++it)
    grouped(2, [&](int r) {
      return ncclAllReduce(send[r].at(), recv[r].at(), 4099, ncclFloat, ncclSum, w[r], nullptr);
    });
  stop = true;
  watchdog.join();
  CHECK(bad.load() == 0);
  CHECK(polls.load() > 0);
  for (int r = 0; r < 2; ++r)
    checkBuf(recv[r], [](size_t i) { return val(0, i) + val(1, i); }, "AllReduce under polling");
}

TEST_CASE("repeated blocking calls from one thread per rank: new buffers, other shapes and groups in between",
          "[api][threads]") {
  // A blocking call that repeats its communicator's last operation reuses
  // that call's job (plan, lane connections): every result must still come
  // from this call's buffers, also after a call of another shape, a group
  // or a zero-count call came in between.
  const int n = 3;
  World w(n);
  const size_t count = 37, gatherCount = 5;
  std::vector<std::string> failures(n);
  auto rankMain = [&](int r) {
    std::vector<float> send[2], recv[2];
    for (int b = 0; b < 2; ++b) {
      send[b].resize(count);
      recv[b].resize(count);
    }
    std::vector<float> gatherIn(gatherCount), gatherOut(gatherCount * n);
    auto fail = [&](const std::string& what) {
      if (failures[r].empty()) failures[r] = what;
    };
    for (int it = 0; it < 60 && failures[r].empty(); ++it) {
      const int b = it % 2;  // alternate buffers under the same shape
      const bool inPlace = it % 7 == 3;
      for (size_t i = 0; i < count; ++i) send[b][i] = static_cast<float>(r + it + static_cast<int>(i));
      float* out = inPlace ? send[b].data() : recv[b].data();
      if (ncclAllReduce(send[b].data(), out, count, ncclFloat, ncclSum, w[r], nullptr) != ncclSuccess)
        fail("AllReduce failed: " + lastError());
      for (size_t i = 0; i < count && failures[r].empty(); ++i) {
        float expected = static_cast<float>(n * (it + static_cast<int>(i)) + n * (n - 1) / 2);
        if (out[i] != expected)
          fail("iteration " + std::to_string(it) + " element " + std::to_string(i) + ": " +
               std::to_string(out[i]) + " != " + std::to_string(expected));
      }
      if (it % 3 == 1) {  // another shape in between
        for (size_t i = 0; i < gatherCount; ++i) gatherIn[i] = static_cast<float>(100 * r + it + static_cast<int>(i));
        if (ncclAllGather(gatherIn.data(), gatherOut.data(), gatherCount, ncclFloat, w[r], nullptr) != ncclSuccess)
          fail("AllGather failed: " + lastError());
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < gatherCount; ++i)
            if (gatherOut[q * gatherCount + i] != static_cast<float>(100 * q + it + static_cast<int>(i)))
              fail("AllGather iteration " + std::to_string(it) + " wrong");
      }
      if (it % 5 == 2) {  // a group of two operations, then a zero-count call
        float one = static_cast<float>(r), sum = 0, all[3] = {0, 0, 0};
        bool ok = ncclGroupStart() == ncclSuccess &&
                  ncclAllReduce(&one, &sum, 1, ncclFloat, ncclSum, w[r], nullptr) == ncclSuccess &&
                  ncclAllGather(&one, all, 1, ncclFloat, w[r], nullptr) == ncclSuccess;
        ok = ncclGroupEnd() == ncclSuccess && ok;
        if (!ok) fail("group failed: " + lastError());
        if (sum != static_cast<float>(n * (n - 1) / 2) || all[0] != 0 || all[1] != 1 || all[2] != 2)
          fail("group results wrong at iteration " + std::to_string(it));
        if (ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, w[r], nullptr) != ncclSuccess)
          fail("zero-count AllReduce failed: " + lastError());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(rankMain, r);
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(failures[r] == "");
  }
  requireWorking(w);
}

// ===========================================================================
// Nonblocking communicators
// ===========================================================================

// Splits of one parent meet over its bootstrap in call order, whichever
// threads run them: back-to-back nonblocking splits, each returning at once,
// and the same inside one group (whose ncclGroupEnd returns at once too, as
// NCCL's), give every rank the children it asked for, in order.
TEST_CASE("back-to-back nonblocking splits of one parent run in call order, alone and in a group",
          "[api][nonblocking][split]") {
  const int n = 4;
  World w(n);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  constexpr int kSplits = 6;
  for (bool inGroup : {false, true}) {
    INFO((inGroup ? "in one group" : "alone"));
    // Split k: colour r % (k + 1), key -r: sizes and ranks differ per split.
    std::vector<std::vector<ncclComm_t>> children(kSplits, std::vector<ncclComm_t>(n, nullptr));
    for (int r = 0; r < n; ++r) {
      if (inGroup) NCCL_OK(ncclGroupStart());
      for (int k = 0; k < kSplits; ++k) {
        ncclResult_t rc = ncclCommSplit(w[r], r % (k + 1), -r, &children[k][r], &cfg);
        INFO("rank " << r << " split " << k << ": " << lastError());
        REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
        REQUIRE(children[k][r] != nullptr);
      }
      if (inGroup) {
        ncclResult_t rc = ncclGroupEnd();
        INFO("rank " << r << ": " << lastError());
        // Returns before the other ranks split at all.
        REQUIRE(rc == ncclInProgress);
      }
    }
    for (int k = 0; k < kSplits; ++k)
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << " split " << k << ": " << lastError());
        REQUIRE(waitAsync(children[k][r]) == ncclSuccess);
        int count = -1, rank = -1;
        NCCL_OK(ncclCommCount(children[k][r], &count));
        NCCL_OK(ncclCommUserRank(children[k][r], &rank));
        int expectCount = 0, expectRank = 0;
        for (int q = 0; q < n; ++q)
          if (q % (k + 1) == r % (k + 1)) {
            ++expectCount;
            if (q > r) ++expectRank;  // key -q: higher parent ranks first
          }
        CHECK(count == expectCount);
        CHECK(rank == expectRank);
      }
    for (auto& split : children)
      for (ncclComm_t c : split) NCCL_OK(ncclCommDestroy(c));
  }
}

TEST_CASE("nonblocking init - collectives - split inheritance and finalize from one thread", "[api][nonblocking]") {
  const int n = 4;
  ncclUniqueId id = newId();
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  std::vector<ncclComm_t> comms(n, nullptr);
  // Rank 0 alone cannot finish; its handle exists but may not be used yet.
  ncclResult_t rc = ncclCommInitRankConfig(&comms[0], n, id, 0, &cfg);
  REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
  REQUIRE(comms[0] != nullptr);
  ncclResult_t state = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comms[0], &state));
  CHECK(state == ncclInProgress);
  int count = 0;
  NCCL_EXPECT(ncclCommCount(comms[0], &count), ncclInvalidArgument);
  for (int r = 1; r < n; ++r) {
    rc = ncclCommInitRankConfig(&comms[r], n, id, r, &cfg);
    REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
    REQUIRE(comms[r] != nullptr);
  }
  for (int r = 0; r < n; ++r) REQUIRE(waitAsync(comms[r]) == ncclSuccess);
  for (int r = 0; r < n; ++r) {
    NCCL_OK(ncclCommCount(comms[r], &count));
    CHECK(count == n);
  }

  const TypeInfo& t = typeOf(ncclFloat32);
  const size_t N = 50000;
  std::vector<Buf> send, recv;
  for (int r = 0; r < n; ++r) {
    send.emplace_back(t, N);
    recv.emplace_back(t, N);
    send[r].fill([r](size_t i) { return val(r, i); });
  }
  auto sum = [n](size_t i) {
    double s = 0;
    for (int q = 0; q < n; ++q) s += val(q, i);
    return s;
  };
  // Outside a group, one call per comm from this thread: each returns at once.
  for (int r = 0; r < n; ++r) {
    rc = ncclAllReduce(send[r].at(), recv[r].at(), N, ncclFloat, ncclSum, comms[r], nullptr);
    INFO("rank " << r << ": " << lastError());
    REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
  }
  for (int r = 0; r < n; ++r) REQUIRE(waitAsync(comms[r]) == ncclSuccess);
  for (int r = 0; r < n; ++r) checkBuf(recv[r], sum, "nonblocking AllReduce");

  // In a group: ncclGroupEnd may return ncclInProgress.
  std::vector<Buf> recv2;
  for (int r = 0; r < n; ++r) recv2.emplace_back(t, N);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; ++r)
    NCCL_OK(ncclAllReduce(send[r].at(), recv2[r].at(), N, ncclFloat, ncclSum, comms[r], nullptr));
  rc = ncclGroupEnd();
  REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
  for (int r = 0; r < n; ++r) REQUIRE(waitAsync(comms[r]) == ncclSuccess);
  for (int r = 0; r < n; ++r) checkBuf(recv2[r], sum, "nonblocking grouped AllReduce");

  // Split with config NULL inherits nonblocking: every call returns at once
  // (a blocking split of one rank could not return before the others call).
  std::vector<ncclComm_t> halves(n, nullptr);
  for (int r = 0; r < n; ++r) {
    rc = ncclCommSplit(comms[r], r / 2, r, &halves[r], nullptr);
    INFO("split rank " << r << ": " << lastError());
    REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
  }
  for (int r = 0; r < n; ++r) REQUIRE(waitAsync(comms[r]) == ncclSuccess);
  for (int r = 0; r < n; ++r) {
    REQUIRE(halves[r] != nullptr);
    REQUIRE(waitAsync(halves[r]) == ncclSuccess);
    int rank = -1;
    NCCL_OK(ncclCommCount(halves[r], &count));
    NCCL_OK(ncclCommUserRank(halves[r], &rank));
    CHECK(count == 2);
    CHECK(rank == r % 2);
  }
  std::vector<Buf> hr;
  for (int r = 0; r < n; ++r) {
    hr.emplace_back(t, N);
    rc = ncclAllReduce(send[r].at(), hr[r].at(), N, ncclFloat, ncclSum, halves[r], nullptr);
    REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
  }
  for (int r = 0; r < n; ++r) REQUIRE(waitAsync(halves[r]) == ncclSuccess);
  for (int r = 0; r < n; ++r) {
    int base = (r / 2) * 2;
    checkBuf(hr[r], [base](size_t i) { return val(base, i) + val(base + 1, i); }, "AllReduce on a nonblocking half");
  }

  for (auto* set : {&halves, &comms})
    for (auto c : *set) {
      rc = ncclCommFinalize(c);
      REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
      REQUIRE(waitAsync(c) == ncclSuccess);
      NCCL_OK(ncclCommDestroy(c));
    }
}

TEST_CASE("nonblocking one-rank comm from ncclCommInitRankConfig", "[api][nonblocking]") {
  ncclUniqueId id = newId();
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, 1, id, 0, &cfg);
  REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
  REQUIRE(comm != nullptr);
  REQUIRE(waitAsync(comm) == ncclSuccess);
  std::vector<float> s(100, 2.f), d(100, 0.f);
  rc = ncclAllReduce(s.data(), d.data(), 100, ncclFloat, ncclSum, comm, nullptr);
  REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
  REQUIRE(waitAsync(comm) == ncclSuccess);
  CHECK(d[0] == 2.f);
  CHECK(d[99] == 2.f);
  NCCL_OK(ncclCommDestroy(comm));
}

// ===========================================================================
// Split
// ===========================================================================

namespace {
// Splits every rank of w inside one group; returns the children.
std::vector<ncclComm_t> splitAll(const World& w, const std::function<int(int)>& color,
                                 const std::function<int(int)>& key) {
  std::vector<ncclComm_t> out(w.size(), nullptr);
  grouped(w.size(), [&](int r) { return ncclCommSplit(w[r], color(r), key(r), &out[r], nullptr); });
  return out;
}

void checkChild(ncclComm_t c, int wantSize, int wantRank) {
  REQUIRE(c != nullptr);
  int count = -1, rank = -1;
  NCCL_OK(ncclCommCount(c, &count));
  NCCL_OK(ncclCommUserRank(c, &rank));
  CHECK(count == wantSize);
  CHECK(rank == wantRank);
}

// AllReduce over a set of communicators (one per parent rank; NULL skipped):
// each result is the sum over the members that share its communicator group.
void allReduceOn(const std::vector<ncclComm_t>& comms, const std::function<int(int)>& color,
                 bool nonblocking = false) {
  const int n = static_cast<int>(comms.size());
  const TypeInfo& t = typeOf(ncclFloat32);
  std::vector<Buf> send, recv;
  for (int r = 0; r < n; ++r) {
    send.emplace_back(t, 200);
    recv.emplace_back(t, 200);
    send[r].fill([r](size_t i) { return val(r, i); });
  }
  NCCL_OK(ncclGroupStart());
  std::vector<ncclResult_t> rcs(n, ncclSuccess);
  for (int r = 0; r < n; ++r)
    if (comms[r]) rcs[r] = ncclAllReduce(send[r].at(), recv[r].at(), 200, ncclFloat, ncclSum, comms[r], nullptr);
  ncclResult_t end = ncclGroupEnd();
  for (int r = 0; r < n; ++r) CHECK(rcs[r] == ncclSuccess);
  INFO(lastError());
  REQUIRE((end == ncclSuccess || (nonblocking && end == ncclInProgress)));
  if (nonblocking)
    for (int r = 0; r < n; ++r)
      if (comms[r]) REQUIRE(waitAsync(comms[r]) == ncclSuccess);
  for (int r = 0; r < n; ++r) {
    if (!comms[r]) continue;
    checkBuf(recv[r], [&](size_t i) {
      double s = 0;
      for (int q = 0; q < n; ++q)
        if (comms[q] && color(q) == color(r)) s += val(q, i);
      return s;
    }, "AllReduce on split child of rank " + std::to_string(r));
  }
}
}  // namespace

TEST_CASE("ncclCommSplit: halves - duplicate - key order - ties", "[api][split]") {
  World w(4);
  {  // halves
    auto color = [](int r) { return r / 2; };
    auto kids = splitAll(w, color, [](int r) { return r; });
    for (int r = 0; r < 4; ++r) checkChild(kids[r], 2, r % 2);
    allReduceOn(kids, color);
    for (auto c : kids) NCCL_OK(ncclCommDestroy(c));
  }
  {  // duplicate
    auto color = [](int) { return 0; };
    auto kids = splitAll(w, color, [](int r) { return r; });
    for (int r = 0; r < 4; ++r) checkChild(kids[r], 4, r);
    allReduceOn(kids, color);
    for (auto c : kids) NCCL_OK(ncclCommDestroy(c));
  }
  {  // keys reverse the order
    auto color = [](int) { return 7; };
    auto kids = splitAll(w, color, [](int r) { return 100 - r; });
    for (int r = 0; r < 4; ++r) checkChild(kids[r], 4, 3 - r);
    allReduceOn(kids, color);
    for (auto c : kids) NCCL_OK(ncclCommDestroy(c));
  }
  {  // equal keys: parent rank order; odd/even colors
    auto color = [](int r) { return r % 2; };
    auto kids = splitAll(w, color, [](int) { return 0; });
    for (int r = 0; r < 4; ++r) checkChild(kids[r], 2, r / 2);
    allReduceOn(kids, color);
    for (auto c : kids) NCCL_OK(ncclCommDestroy(c));
  }
  ncclComm_t none = nullptr;
  NCCL_EXPECT(ncclCommSplit(w[0], -2, 0, &none, nullptr), ncclInvalidArgument);
  CHECK(none == nullptr);
  requireWorking(w);
}

TEST_CASE("ncclCommSplit with NCCL_SPLIT_NOCOLOR - one thread per rank", "[api][split]") {
  const int n = 4;
  std::vector<int> sizes(n, -1), ranks(n, -1);
  std::vector<char> isNull(n, 0);  // one byte per rank: threads write their own (vector<bool> packs bits)
  auto errors = runThreads(n, [&](int r, ncclComm_t comm) -> std::string {
    ncclComm_t child = reinterpret_cast<ncclComm_t>(0x1);  // must be overwritten
    T_NCCL(ncclCommSplit(comm, r < 2 ? 0 : NCCL_SPLIT_NOCOLOR, r, &child, nullptr));
    isNull[r] = child == nullptr;
    if (child) {
      T_NCCL(ncclCommCount(child, &sizes[r]));
      T_NCCL(ncclCommUserRank(child, &ranks[r]));
      std::vector<float> s(10, static_cast<float>(r + 1)), d(10, 0.f);
      T_NCCL(ncclAllReduce(s.data(), d.data(), 10, ncclFloat, ncclSum, child, nullptr));
      T_CHECK(d[0] == 3.f, "AllReduce on the 2-rank child");
      T_NCCL(ncclCommDestroy(child));
    }
    // The parent still works after the split.
    std::vector<float> s(10, 1.f), d(10, 0.f);
    T_NCCL(ncclAllReduce(s.data(), d.data(), 10, ncclFloat, ncclSum, comm, nullptr));
    T_CHECK(d[9] == static_cast<float>(n), "parent AllReduce after split");
    return "";
  });
  requireNoErrors(errors);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    if (r < 2) {
      CHECK_FALSE(isNull[r]);
      CHECK(sizes[r] == 2);
      CHECK(ranks[r] == r);
    } else {
      CHECK(isNull[r]);
    }
  }
}

TEST_CASE("ncclCommSplit with NCCL_SPLIT_NOCOLOR inside a group from one thread", "[api][split]") {
  World w(4);
  auto color = [](int r) { return r < 2 ? 0 : NCCL_SPLIT_NOCOLOR; };
  std::vector<ncclComm_t> kids(4, reinterpret_cast<ncclComm_t>(0x1));
  auto t0 = Clock::now();
  grouped(4, [&](int r) { return ncclCommSplit(w[r], color(r), r, &kids[r], nullptr); });
  INFO("the grouped split took " << msSince(t0) << " ms");
  CHECK(kids[2] == nullptr);
  CHECK(kids[3] == nullptr);
  checkChild(kids[0], 2, 0);
  checkChild(kids[1], 2, 1);
  allReduceOn(kids, [](int r) { return r < 2 ? 0 : -1; });
  for (auto c : kids)
    if (c) NCCL_OK(ncclCommDestroy(c));
  requireWorking(w);
}

// n nonblocking communicators of one clique, made from this thread.
class NonblockingWorld {
 public:
  explicit NonblockingWorld(int n) : comms_(n, nullptr) {
    ncclUniqueId id = newId();
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    for (int r = 0; r < n; ++r) {
      ncclResult_t rc = ncclCommInitRankConfig(&comms_[r], n, id, r, &cfg);
      INFO("rank " << r << ": " << lastError());
      REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
    }
    for (int r = 0; r < n; ++r) REQUIRE(waitAsync(comms_[r]) == ncclSuccess);
  }
  NonblockingWorld(const NonblockingWorld&) = delete;
  NonblockingWorld& operator=(const NonblockingWorld&) = delete;
  ~NonblockingWorld() {
    for (auto& c : comms_)
      if (c) (void)ncclCommDestroy(c);
  }
  ncclComm_t operator[](int r) const { return comms_[r]; }
  void release(int r) { comms_[r] = nullptr; }

 private:
  std::vector<ncclComm_t> comms_;
};

// As NCCL, whose split job belongs to the parent: a split of a nonblocking
// parent in which a rank gets no communicator returns ncclInProgress at once
// (alone, or from ncclGroupEnd), and that rank's parent reads ncclInProgress
// until its part of the exchange has run. One thread drives every rank, the
// ranks without a colour first: a part that ran on the calling thread would
// wait there for peers that thread has not reached yet. A blocking parent
// blocks, whatever the split's config says (NCCL reads none for NOCOLOR).
TEST_CASE("a NCCL_SPLIT_NOCOLOR split of a nonblocking parent returns at once and the parent is in progress "
          "until it ran",
          "[api][nonblocking][split]") {
  const int n = 4;
  NonblockingWorld w(n);
  auto color = [](int r) { return r < 2 ? 0 : NCCL_SPLIT_NOCOLOR; };
  for (bool inGroup : {false, true}) {
    INFO((inGroup ? "in a group" : "alone"));
    std::vector<ncclComm_t> kids(n, reinterpret_cast<ncclComm_t>(0x1));
    for (int r = n - 1; r >= 0; --r) {
      if (inGroup) NCCL_OK(ncclGroupStart());
      ncclResult_t rc = ncclCommSplit(w[r], color(r), r, &kids[r], nullptr);
      if (inGroup) {
        CHECK(rc == ncclSuccess);
        rc = ncclGroupEnd();
      }
      INFO("rank " << r << ": " << lastError());
      // Rank 0 is the last to split: its own split may already have finished.
      REQUIRE((rc == ncclInProgress || (r == 0 && rc == ncclSuccess)));
      if (color(r) == NCCL_SPLIT_NOCOLOR) CHECK(kids[r] == nullptr);
      if (r == n - 1) {
        // Ranks 0 to 2 have not split yet: rank 3's part cannot have run.
        ncclResult_t state = ncclSuccess;
        NCCL_OK(ncclCommGetAsyncError(w[r], &state));
        CHECK(state == ncclInProgress);
      }
    }
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << ": " << lastError());
      REQUIRE(waitAsync(w[r]) == ncclSuccess);
      if (kids[r]) REQUIRE(waitAsync(kids[r]) == ncclSuccess);
    }
    checkChild(kids[0], 2, 0);
    checkChild(kids[1], 2, 1);
    allReduceOn(kids, [](int r) { return r < 2 ? 0 : -1; }, /*nonblocking=*/true);
    for (auto c : kids)
      if (c) NCCL_OK(ncclCommDestroy(c));
  }
  // The parents still work, their later splits included.
  std::vector<ncclComm_t> again(n, nullptr);
  for (int r = 0; r < n; ++r) {
    ncclResult_t rc = ncclCommSplit(w[r], r % 2 == 0 ? 0 : NCCL_SPLIT_NOCOLOR, r, &again[r], nullptr);
    REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
  }
  for (int r = 0; r < n; ++r) {
    REQUIRE(waitAsync(w[r]) == ncclSuccess);
    if (again[r]) REQUIRE(waitAsync(again[r]) == ncclSuccess);
  }
  checkChild(again[0], 2, 0);
  checkChild(again[2], 2, 1);
  CHECK(again[1] == nullptr);
  for (auto c : again)
    if (c) NCCL_OK(ncclCommDestroy(c));

  // A blocking parent: the split blocks and returns ncclSuccess even with a
  // nonblocking config, as NCCL's.
  World b(1);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t none = reinterpret_cast<ncclComm_t>(0x1);
  NCCL_OK(ncclCommSplit(b[0], NCCL_SPLIT_NOCOLOR, 0, &none, &cfg));
  CHECK(none == nullptr);
  ncclResult_t state = ncclInProgress;
  NCCL_OK(ncclCommGetAsyncError(b[0], &state));
  CHECK(state == ncclSuccess);
}

// A revoked parent may still split (NCCL allows it): its NOCOLOR part is
// in progress there too, until it ran.
TEST_CASE("a NCCL_SPLIT_NOCOLOR split of a revoked nonblocking parent is in progress until it ran",
          "[api][nonblocking][split]") {
  const int n = 2;
  NonblockingWorld w(n);
  for (int r = 0; r < n; ++r) NCCL_OK(ncclCommRevoke(w[r], NCCL_REVOKE_DEFAULT));
  for (int r = 0; r < n; ++r) REQUIRE(waitAsync(w[r]) == ncclSuccess);
  std::vector<ncclComm_t> kids(n, reinterpret_cast<ncclComm_t>(0x1));
  CHECK(ncclCommSplit(w[1], NCCL_SPLIT_NOCOLOR, 1, &kids[1], nullptr) == ncclInProgress);
  CHECK(kids[1] == nullptr);
  ncclResult_t state = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(w[1], &state));
  CHECK(state == ncclInProgress);  // rank 0 has not split yet
  ncclResult_t rc = ncclCommSplit(w[0], 0, 0, &kids[0], nullptr);
  REQUIRE((rc == ncclInProgress || rc == ncclSuccess));
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << lastError());
    REQUIRE(waitAsync(w[r]) == ncclSuccess);
  }
  REQUIRE(waitAsync(kids[0]) == ncclSuccess);
  checkChild(kids[0], 1, 0);
  NCCL_OK(ncclCommDestroy(kids[0]));
}

// A NOCOLOR part that fails (its peer never splits, and the set-up deadline
// passes) makes that the parent's async error: nothing else could say it.
TEST_CASE("a NCCL_SPLIT_NOCOLOR part that fails becomes its nonblocking parent's error", "[api][nonblocking][split]") {
  shoal::testing::ScopedEnv shortSetup{{"SHOAL_INIT_TIMEOUT_MS", "500"}};
  NonblockingWorld w(2);
  ncclComm_t none = reinterpret_cast<ncclComm_t>(0x1);
  CHECK(ncclCommSplit(w[0], NCCL_SPLIT_NOCOLOR, 0, &none, nullptr) == ncclInProgress);
  const ncclResult_t state = waitAsync(w[0], 20000);
  INFO(lastError());
  CHECK(state != ncclInProgress);
  CHECK(state != ncclSuccess);
  CHECK(lastError().find("split") != std::string::npos);
  NCCL_OK(ncclCommAbort(w[0]));
  w.release(0);
}

// A NOCOLOR part that can never finish (its peer never splits) ends with
// its parent's ncclCommAbort, which joins its thread.
TEST_CASE("ncclCommAbort of a nonblocking parent whose NOCOLOR part waits returns promptly", "[api][split]") {
  NonblockingWorld w(2);
  const int threadsBefore = settledThreadCount();
  ncclComm_t none = reinterpret_cast<ncclComm_t>(0x1);
  CHECK(ncclCommSplit(w[0], NCCL_SPLIT_NOCOLOR, 0, &none, nullptr) == ncclInProgress);
  CHECK(none == nullptr);
  ncclResult_t state = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(w[0], &state));
  CHECK(state == ncclInProgress);
  NCCL_EXPECT(ncclCommDestroy(w[0]), ncclInvalidArgument);  // as NCCL: not while the split runs
  CHECK(lastError().find("nonblocking ncclCommSplit") != std::string::npos);
  const auto t0 = Clock::now();
  NCCL_OK(ncclCommAbort(w[0]));
  w.release(0);
  INFO("ncclCommAbort took " << msSince(t0) << " ms");
  CHECK(msSince(t0) < 2000);
  if (threadsBefore > 0) CHECK(threadCountSettlingAt(threadsBefore) == threadsBefore);
}

// ===========================================================================
// Bad inputs: immediate ncclInvalidArgument with a reason; the comm keeps working
// ===========================================================================

TEST_CASE("bad arguments fail at once with a reason and leave the communicator usable", "[api][errors]") {
  World w(2);
  const int n = 2;
  std::vector<float> a(16, 1.f), b(16 * n, 0.f);
  float* s = a.data();
  float* d = b.data();
  ncclComm_t c = w[0];  // rank 0 alone: errors need no peer
  const auto badType = static_cast<ncclDataType_t>(ncclNumTypes);
  const auto negType = static_cast<ncclDataType_t>(-1);
  struct Case {
    const char* name;
    std::function<ncclResult_t()> call;
    ncclResult_t want;
    const char* keyword;
  };
  std::vector<Case> cases = {
      {"AllReduce bad datatype", [&] { return ncclAllReduce(s, d, 16, badType, ncclSum, c, nullptr); }, ncclInvalidArgument, "type"},
      {"AllReduce negative datatype", [&] { return ncclAllReduce(s, d, 16, negType, ncclSum, c, nullptr); }, ncclInvalidArgument, "type"},
      {"Broadcast bad datatype", [&] { return ncclBroadcast(s, d, 16, badType, 0, c, nullptr); }, ncclInvalidArgument, "type"},
      {"Send bad datatype", [&] { return ncclSend(s, 16, badType, 1, c, nullptr); }, ncclInvalidArgument, "type"},
      {"AllReduce op ncclNumOps (never created)", [&] { return ncclAllReduce(s, d, 16, ncclFloat, ncclNumOps, c, nullptr); }, ncclInvalidArgument, "reduction operator"},
      {"AllReduce op -1", [&] { return ncclAllReduce(s, d, 16, ncclFloat, static_cast<ncclRedOp_t>(-1), c, nullptr); }, ncclInvalidArgument, "reduction operator"},
      {"AllReduce op ncclMaxRedOp", [&] { return ncclAllReduce(s, d, 16, ncclFloat, ncclMaxRedOp, c, nullptr); }, ncclInvalidArgument, "reduction operator"},
      {"ReduceScatter bad op", [&] { return ncclReduceScatter(s, d, 8, ncclFloat, static_cast<ncclRedOp_t>(99), c, nullptr); }, ncclInvalidArgument, "reduction operator"},
      {"Reduce bad op", [&] { return ncclReduce(s, d, 16, ncclFloat, static_cast<ncclRedOp_t>(-5), 0, c, nullptr); }, ncclInvalidArgument, "reduction operator"},
      {"Broadcast root -1", [&] { return ncclBroadcast(s, d, 16, ncclFloat, -1, c, nullptr); }, ncclInvalidArgument, "root"},
      {"Broadcast root n", [&] { return ncclBroadcast(s, d, 16, ncclFloat, n, c, nullptr); }, ncclInvalidArgument, "root"},
      {"Bcast root n", [&] { return ncclBcast(d, 16, ncclFloat, n, c, nullptr); }, ncclInvalidArgument, "root"},
      {"Reduce root n", [&] { return ncclReduce(s, d, 16, ncclFloat, ncclSum, n, c, nullptr); }, ncclInvalidArgument, "root"},
      {"Gather root n", [&] { return ncclGather(s, d, 16, ncclFloat, n, c, nullptr); }, ncclInvalidArgument, "root"},
      {"Scatter root -1", [&] { return ncclScatter(s, d, 16, ncclFloat, -1, c, nullptr); }, ncclInvalidArgument, "root"},
      {"Send peer n", [&] { return ncclSend(s, 16, ncclFloat, n, c, nullptr); }, ncclInvalidArgument, "peer"},
      {"Send peer -1", [&] { return ncclSend(s, 16, ncclFloat, -1, c, nullptr); }, ncclInvalidArgument, "peer"},
      {"Recv peer n", [&] { return ncclRecv(d, 16, ncclFloat, n, c, nullptr); }, ncclInvalidArgument, "peer"},
      {"AllReduce NULL comm", [&] { return ncclAllReduce(s, d, 16, ncclFloat, ncclSum, nullptr, nullptr); }, ncclInvalidArgument, "comm"},
      {"Send NULL comm", [&] { return ncclSend(s, 16, ncclFloat, 0, nullptr, nullptr); }, ncclInvalidArgument, "comm"},
      {"AllReduce NULL sendbuff", [&] { return ncclAllReduce(nullptr, d, 16, ncclFloat, ncclSum, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"AllReduce NULL recvbuff", [&] { return ncclAllReduce(s, nullptr, 16, ncclFloat, ncclSum, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"Broadcast NULL sendbuff at the root", [&] { return ncclBroadcast(nullptr, d, 16, ncclFloat, 0, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"Broadcast NULL recvbuff", [&] { return ncclBroadcast(s, nullptr, 16, ncclFloat, 1, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"Reduce NULL sendbuff", [&] { return ncclReduce(nullptr, d, 16, ncclFloat, ncclSum, 1, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"Reduce NULL recvbuff at the root", [&] { return ncclReduce(s, nullptr, 16, ncclFloat, ncclSum, 0, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"AllGather NULL recvbuff", [&] { return ncclAllGather(s, nullptr, 8, ncclFloat, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"ReduceScatter NULL sendbuff", [&] { return ncclReduceScatter(nullptr, d, 8, ncclFloat, ncclSum, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"AlltoAll NULL sendbuff", [&] { return ncclAlltoAll(nullptr, d, 8, ncclFloat, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"Gather NULL sendbuff", [&] { return ncclGather(nullptr, d, 8, ncclFloat, 1, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"Gather NULL recvbuff at the root", [&] { return ncclGather(s, nullptr, 8, ncclFloat, 0, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"Scatter NULL sendbuff at the root", [&] { return ncclScatter(nullptr, d, 8, ncclFloat, 0, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"Scatter NULL recvbuff", [&] { return ncclScatter(s, nullptr, 8, ncclFloat, 1, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"Send NULL sendbuff", [&] { return ncclSend(nullptr, 16, ncclFloat, 1, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"Recv NULL recvbuff", [&] { return ncclRecv(nullptr, 16, ncclFloat, 1, c, nullptr); }, ncclInvalidArgument, "buff"},
      {"Shrink excluding the caller", [&] {
         int excl = 0;
         ncclComm_t nc = nullptr;
         return ncclCommShrink(c, &excl, 1, &nc, nullptr, NCCL_SHRINK_DEFAULT);
       }, ncclInvalidUsage, "excludeRanksList"},
      {"Shrink excluding rank n", [&] {
         int excl = n;
         ncclComm_t nc = nullptr;
         return ncclCommShrink(c, &excl, 1, &nc, nullptr, NCCL_SHRINK_DEFAULT);
       }, ncclInvalidArgument, "out of range"},
      {"WindowRegister unknown flags", [&] {
         ncclWindow_t win = nullptr;
         return ncclCommWindowRegister(c, d, 64, &win, 0x40);
       }, ncclInvalidArgument, "winFlags"},
      {"WindowRegister NULL buff", [&] {
         ncclWindow_t win = nullptr;
         return ncclCommWindowRegister(c, nullptr, 64, &win, NCCL_WIN_DEFAULT);
       }, ncclInvalidArgument, "memory"},
      {"GetAsyncError NULL output", [&] { return ncclCommGetAsyncError(c, nullptr); }, ncclInvalidArgument, "asyncError"},
      {"GetAsyncError NULL comm", [&] {
         ncclResult_t st;
         return ncclCommGetAsyncError(nullptr, &st);
       }, ncclInvalidArgument, "comm"},
  };
  for (const auto& k : cases) {
    INFO(k.name);
    auto t0 = Clock::now();
    ncclResult_t rc = k.call();
    std::string why = lastError();
    INFO("returned " << ncclGetErrorString(rc) << " (" << int(rc) << "); ncclGetLastError: " << why);
    CHECK(rc == k.want);
    CHECK(msSince(t0) < 1000);
    CHECK(mentions(why, k.keyword));
  }
  // Rank 0 never reached its peer in any of them: both ranks still work.
  requireWorking(w);
}

// ===========================================================================
// Config parsing (NCCL's parseCommConfig; src/api/config.h)
// ===========================================================================

namespace {
// One-rank init with a config; returns the init result (and cleans up).
ncclResult_t initWithConfig(ncclConfig_t* cfg) {
  ncclUniqueId id = newId();
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, 1, id, 0, cfg);
  if (comm && (rc == ncclSuccess || rc == ncclInProgress)) {
    if (rc == ncclInProgress) (void)waitAsync(comm);
    (void)ncclCommDestroy(comm);
  }
  return rc;
}
}  // namespace

TEST_CASE("ncclConfig_t: magic - ranges - version resets - size clamping", "[api][config]") {
  {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.magic = 0x12345678;
    ncclResult_t rc = initWithConfig(&cfg);
    CHECK(rc == ncclInvalidArgument);
    CHECK(mentions(lastError(), "NCCL_CONFIG_INITIALIZER"));
  }
  {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    CHECK(initWithConfig(&cfg) == ncclSuccess);
    CHECK(initWithConfig(nullptr) == ncclSuccess);
  }
  {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 2;
    CHECK(initWithConfig(&cfg) == ncclInvalidArgument);
  }
  {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.minCTAs = 8;
    cfg.maxCTAs = 2;
    CHECK(initWithConfig(&cfg) == ncclInvalidArgument);
  }
  {  // NCCL 2.30's ranges: what it accepts and what it refuses, field by field.
    struct Case {
      const char* what;
      std::function<void(ncclConfig_t&)> set;
      ncclResult_t expect;
    };
    const std::vector<Case> cases = {
        {"cgaClusterSize 16", [](ncclConfig_t& c) { c.cgaClusterSize = 16; }, ncclSuccess},
        {"cgaClusterSize -2", [](ncclConfig_t& c) { c.cgaClusterSize = -2; }, ncclInvalidArgument},
        {"CTAPolicy EFFICIENCY|ZERO", [](ncclConfig_t& c) { c.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO; }, ncclSuccess},
        {"CTAPolicy 4", [](ncclConfig_t& c) { c.CTAPolicy = 4; }, ncclInvalidArgument},
        // minCTAs and maxCTAs are compared only where both are set; above the
        // 64 channels there are, they are capped.
        {"minCTAs 128 alone", [](ncclConfig_t& c) { c.minCTAs = 128; }, ncclSuccess},
        {"maxCTAs 1000 alone", [](ncclConfig_t& c) { c.maxCTAs = 1000; }, ncclSuccess},
        {"minCTAs 0", [](ncclConfig_t& c) { c.minCTAs = 0; }, ncclInvalidArgument},
        {"maxCTAs -3", [](ncclConfig_t& c) { c.maxCTAs = -3; }, ncclInvalidArgument},
        {"minCTAs 128 with maxCTAs 100", [](ncclConfig_t& c) { c.minCTAs = 128, c.maxCTAs = 100; }, ncclInvalidArgument},
        {"collnetEnable 5", [](ncclConfig_t& c) { c.collnetEnable = 5; }, ncclInvalidArgument},
        {"shrinkShare 7", [](ncclConfig_t& c) { c.shrinkShare = 7; }, ncclInvalidArgument},
        {"nvlsCTAs 0", [](ncclConfig_t& c) { c.nvlsCTAs = 0; }, ncclInvalidArgument},
        {"nvlsCTAs 16", [](ncclConfig_t& c) { c.nvlsCTAs = 16; }, ncclSuccess},
        {"nChannelsPerNetPeer 65", [](ncclConfig_t& c) { c.nChannelsPerNetPeer = 65; }, ncclInvalidArgument},
        {"nChannelsPerNetPeer 4", [](ncclConfig_t& c) { c.nChannelsPerNetPeer = 4; }, ncclSuccess},
        {"nvlinkCentricSched 2", [](ncclConfig_t& c) { c.nvlinkCentricSched = 2; }, ncclInvalidArgument},
        {"numRmaCtx -1", [](ncclConfig_t& c) { c.numRmaCtx = -1; }, ncclInvalidArgument},
        {"maxP2pPeers 0", [](ncclConfig_t& c) { c.maxP2pPeers = 0; }, ncclInvalidArgument},
        {"maxP2pPeers 2", [](ncclConfig_t& c) { c.maxP2pPeers = 2; }, ncclSuccess},
        {"graphStreamOrdering 3", [](ncclConfig_t& c) { c.graphStreamOrdering = 3; }, ncclInvalidArgument},
    };
    for (const Case& k : cases) {
      INFO(k.what);
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      k.set(cfg);
      CHECK(initWithConfig(&cfg) == k.expect);
    }
  }
  {  // netName: only a peer on another host needs the network it names (tcp_test:
     // selectTransport refuses a name Shoal has no network for); one host's init works
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.netName = "Socket";
    CHECK(initWithConfig(&cfg) == ncclSuccess);
    cfg.netName = "IB";
    CHECK(initWithConfig(&cfg) == ncclSuccess);
  }
  {  // blocking = 0 is honoured from a 2.14+ header...
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    CHECK(initWithConfig(&cfg) == ncclInProgress);
    cfg.version = NCCL_VERSION(2, 14, 0);
    cfg.size = 24;  // the 2.14 struct
    CHECK(initWithConfig(&cfg) == ncclInProgress);
  }
  {  // ...but reset (to blocking) for a caller whose version predates the field.
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.version = NCCL_VERSION(2, 13, 0);
    CHECK(initWithConfig(&cfg) == ncclSuccess);
  }
  {  // fields newer than the caller's version are ignored even if they hold garbage
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.version = NCCL_VERSION(2, 26, 0);
    cfg.size = 48;
    cfg.CTAPolicy = 99;       // a 2.27 field
    cfg.graphUsageMode = 77;  // a 2.29 field
    CHECK(initWithConfig(&cfg) == ncclSuccess);
    cfg.size = sizeof(ncclConfig_t);  // same garbage inside the size, still reset by version
    CHECK(initWithConfig(&cfg) == ncclSuccess);
    cfg.version = NCCL_VERSION_CODE;  // now they are read and rejected
    CHECK(initWithConfig(&cfg) == ncclInvalidArgument);
  }
  {  // bytes past the caller's size are never read (a 2.17 struct is 40 bytes)
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.version = NCCL_VERSION(2, 17, 0);
    cfg.size = 40;
    cfg.CTAPolicy = 55;
    cfg.splitShare = 9;
    CHECK(initWithConfig(&cfg) == ncclSuccess);
  }
  {  // a struct larger than ours (a newer header) is truncated
    struct Bigger {
      ncclConfig_t base;
      int futureFields[16];
    } big;
    std::memset(&big, 0x7f, sizeof(big));
    ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
    big.base = init;
    big.base.size = sizeof(Bigger);
    big.base.version = NCCL_VERSION(2, 40, 0);
    CHECK(initWithConfig(&big.base) == ncclSuccess);
  }
}

// ===========================================================================
// Memory and registration
// ===========================================================================

TEST_CASE("ncclMemAlloc/ncclMemFree - also inside a group - foreign pointers rejected", "[api][memory]") {
  void* p = nullptr;
  NCCL_OK(ncclMemAlloc(&p, 1 << 20));
  REQUIRE(p != nullptr);
  std::memset(p, 0x5a, 1 << 20);
  NCCL_OK(ncclMemFree(p));
  NCCL_EXPECT(ncclMemAlloc(nullptr, 64), ncclInvalidArgument);

  NCCL_OK(ncclGroupStart());
  void* q = nullptr;
  ncclResult_t rc = ncclMemAlloc(&q, 4096);
  ncclResult_t rcFree = q ? ncclMemFree(q) : ncclInternalError;
  NCCL_OK(ncclGroupEnd());
  CHECK(rc == ncclSuccess);
  CHECK(q != nullptr);
  CHECK(rcFree == ncclSuccess);

  void* foreign = std::malloc(256);
  CHECK(ncclMemFree(foreign) != ncclSuccess);
  std::free(foreign);

  // ncclMemAlloc'd buffers work as collective buffers.
  World w(2);
  std::vector<void*> s(2), d(2);
  for (int r = 0; r < 2; ++r) {
    NCCL_OK(ncclMemAlloc(&s[r], 1000 * sizeof(float)));
    NCCL_OK(ncclMemAlloc(&d[r], 1000 * sizeof(float)));
    for (int i = 0; i < 1000; ++i) static_cast<float*>(s[r])[i] = static_cast<float>(r + i % 3);
  }
  grouped(2, [&](int r) { return ncclAllReduce(s[r], d[r], 1000, ncclFloat, ncclSum, w[r], nullptr); });
  for (int r = 0; r < 2; ++r) {
    CHECK(static_cast<float*>(d[r])[0] == 1.f);
    CHECK(static_cast<float*>(d[r])[999] == static_cast<float>(1 + 2 * (999 % 3)));
    NCCL_OK(ncclMemFree(s[r]));
    NCCL_OK(ncclMemFree(d[r]));
  }
}

TEST_CASE("ncclMemAlloc larger than /dev/shm is an error at once, not a SIGBUS at first use", "[api][memory]") {
  struct statvfs fs {};
  REQUIRE(statvfs("/dev/shm", &fs) == 0);
  const size_t capacity = static_cast<size_t>(fs.f_blocks) * fs.f_frsize;
  void* p = nullptr;
  NCCL_EXPECT(ncclMemAlloc(&p, capacity + (size_t{1} << 30)), ncclSystemError);
  CHECK(p == nullptr);
  CHECK_THAT(ncclGetLastError(nullptr), Catch::Contains("/dev/shm"));
  DIR* dir = opendir("/dev/shm");  // and nothing is left behind
  REQUIRE(dir != nullptr);
  const std::string mine = "shoal-" + std::to_string(getpid()) + "-mem-";
  int left = 0;
  while (dirent* e = readdir(dir)) left += std::string(e->d_name).rfind(mine, 0) == 0;
  closedir(dir);
  CHECK(left == 0);
}

TEST_CASE("ncclCommRegister/Deregister - also inside a group", "[api][memory]") {
  World w(2);
  std::vector<std::vector<float>> s(2, std::vector<float>(512)), d(2, std::vector<float>(512));
  std::vector<void*> hs(2, nullptr), hd(2, nullptr);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r) {
    CHECK(ncclCommRegister(w[r], s[r].data(), 512 * sizeof(float), &hs[r]) == ncclSuccess);
    CHECK(ncclCommRegister(w[r], d[r].data(), 512 * sizeof(float), &hd[r]) == ncclSuccess);
  }
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < 2; ++r) {
    REQUIRE(hs[r] != nullptr);
    REQUIRE(hd[r] != nullptr);
    for (int i = 0; i < 512; ++i) s[r][i] = static_cast<float>(r * 10 + i % 4);
  }
  grouped(2, [&](int r) { return ncclAllReduce(s[r].data(), d[r].data(), 512, ncclFloat, ncclSum, w[r], nullptr); });
  for (int r = 0; r < 2; ++r) CHECK(d[r][5] == static_cast<float>(10 + 2 * (5 % 4)));
  for (int r = 0; r < 2; ++r) {
    NCCL_OK(ncclCommDeregister(w[r], hs[r]));
    NCCL_OK(ncclCommDeregister(w[r], hd[r]));
  }
  NCCL_EXPECT(ncclCommDeregister(w[0], hs[0]), ncclInvalidUsage);  // already gone (NCCL: "Could not find handle")
  void* h = nullptr;
  NCCL_EXPECT(ncclCommRegister(w[0], nullptr, 64, &h), ncclInvalidArgument);
  NCCL_EXPECT(ncclCommRegister(nullptr, s[0].data(), 64, &h), ncclInvalidArgument);
  requireWorking(w);
}

// As NCCL: a range within the pages of a live registration of the same
// communicator gets that registration's handle again, counted; the
// registration (and its range's place among the known ones) ends at the
// last deregistration.
TEST_CASE("ncclCommRegister of a range already registered answers the same handle, counted", "[api][memory]") {
  World w(2);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* mem = std::aligned_alloc(page, 4 * page);
  REQUIRE(mem != nullptr);
  auto* bytes = static_cast<uint8_t*>(mem);
  void* whole = nullptr;
  void* again = nullptr;
  void* inside = nullptr;
  void* other = nullptr;
  void* elsewhere = nullptr;
  NCCL_OK(ncclCommRegister(w[0], bytes, 2 * page, &whole));
  NCCL_OK(ncclCommRegister(w[0], bytes, 2 * page, &again));
  NCCL_OK(ncclCommRegister(w[0], bytes + 100, page, &inside));
  NCCL_OK(ncclCommRegister(w[1], bytes, 2 * page, &other));          // another communicator
  NCCL_OK(ncclCommRegister(w[0], bytes + page, 2 * page, &elsewhere));  // past its pages
  CHECK(again == whole);
  CHECK(inside == whole);
  CHECK(other != whole);
  CHECK(elsewhere != whole);
  NCCL_OK(ncclCommDeregister(w[0], whole));
  NCCL_OK(ncclCommDeregister(w[0], again));
  CHECK(shoal::memory::isRemembered(bytes, 2 * page));  // one registration of three left
  NCCL_OK(ncclCommDeregister(w[0], inside));
  NCCL_EXPECT(ncclCommDeregister(w[0], whole), ncclInvalidUsage);  // ended
  NCCL_OK(ncclCommDeregister(w[0], elsewhere));
  NCCL_OK(ncclCommDeregister(w[1], other));
  CHECK_FALSE(shoal::memory::isRemembered(bytes, 2 * page));
  std::free(mem);
  requireWorking(w);
}

// A registered buffer is memory whose end Shoal hears of: a network that
// needs registrations keeps its registration until then. So the end must
// come: a deregistration on a revoked communicator works, and destroy or
// abort ends what was not deregistered (as NCCL's destroy does), or a
// buffer the user frees afterwards would stay "known" at its address.
TEST_CASE("ncclCommRegister ranges end at deregister - also on a revoked communicator - or at destroy and abort",
          "[api][memory]") {
  std::vector<uint8_t> a(4096), b(4096), c(4096);
  for (const char* end : {"deregister after revoke", "destroy", "abort"}) {
    INFO(end);
    ncclComm_t comm = nullptr;
    NCCL_OK(ncclCommInitRank(&comm, 1, newId(), 0));
    void* ha = nullptr;
    void* hb = nullptr;
    NCCL_OK(ncclCommRegister(comm, a.data(), a.size(), &ha));
    NCCL_OK(ncclCommRegister(comm, b.data(), b.size(), &hb));
    CHECK(shoal::memory::isRemembered(a.data(), a.size()));
    CHECK(shoal::memory::isRemembered(b.data(), b.size()));
    if (std::string(end) == "deregister after revoke") {
      NCCL_OK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
      NCCL_OK(ncclCommDeregister(comm, ha));
      CHECK_FALSE(shoal::memory::isRemembered(a.data(), 1));
      CHECK(shoal::memory::isRemembered(b.data(), 1));
      NCCL_OK(ncclCommDestroy(comm));
    } else if (std::string(end) == "destroy") {
      NCCL_OK(ncclCommDestroy(comm));
    } else {
      NCCL_OK(ncclCommAbort(comm));
    }
    CHECK_FALSE(shoal::memory::isRemembered(a.data(), 1));
    CHECK_FALSE(shoal::memory::isRemembered(b.data(), 1));
  }
  // Another communicator's registrations are its own.
  World w(2);
  void* hc = nullptr;
  NCCL_OK(ncclCommRegister(w[0], c.data(), c.size(), &hc));
  ncclComm_t other = nullptr;
  NCCL_OK(ncclCommInitRank(&other, 1, newId(), 0));
  NCCL_OK(ncclCommDestroy(other));
  CHECK(shoal::memory::isRemembered(c.data(), c.size()));
  NCCL_OK(ncclCommDeregister(w[0], hc));
}

// ===========================================================================
// Parameters
// ===========================================================================

TEST_CASE("parameter API: keys - bind - typed reads", "[api][params]") {
  const char** keys = nullptr;
  int nkeys = 0;
  NCCL_OK(ncclParamGetAllParameterKeys(&keys, &nkeys));
  REQUIRE(keys != nullptr);
  REQUIRE(nkeys > 0);
  bool haveDebug = false, haveProgress = false;
  for (int i = 0; i < nkeys; ++i) {
    REQUIRE(keys[i] != nullptr);
    if (std::string(keys[i]) == "NCCL_DEBUG") haveDebug = true;
    if (std::string(keys[i]) == "SHOAL_PROGRESS_TIMEOUT_MS") haveProgress = true;
  }
  CHECK(haveDebug);
  CHECK(haveProgress);

  // This process set SHOAL_PROGRESS_TIMEOUT_MS before any Shoal call.
  const char* env = std::getenv("SHOAL_PROGRESS_TIMEOUT_MS");
  REQUIRE(env != nullptr);
  const int64_t want = std::strtoll(env, nullptr, 10);
  ncclParamHandle_t h = nullptr;
  NCCL_OK(ncclParamBind(&h, "SHOAL_PROGRESS_TIMEOUT_MS"));
  REQUIRE(h != nullptr);
  int64_t v = -1;
  NCCL_OK(ncclParamGetI64(h, &v));
  CHECK(v == want);
  uint64_t u = 0;
  NCCL_OK(ncclParamGetU64(h, &u));
  CHECK(u == static_cast<uint64_t>(want));
  if (want > 127) {
    int8_t tiny = 0;
    CHECK(ncclParamGetI8(h, &tiny) != ncclSuccess);  // does not fit in int8
  }
  const char* str = nullptr;
  NCCL_OK(ncclParamGetStr(h, &str));
  REQUIRE(str != nullptr);
  CHECK(std::string(str) == env);
  const char* value = nullptr;
  int len = -1;
  NCCL_OK(ncclParamGetParameter("SHOAL_PROGRESS_TIMEOUT_MS", &value, &len));
  REQUIRE(value != nullptr);
  CHECK(std::string(value, static_cast<size_t>(len)) == env);
  char buf[64];
  NCCL_OK(ncclParamGet(h, buf, sizeof(buf), &len));
  CHECK(std::string(buf) == env);

  ncclParamHandle_t nope = nullptr;
  CHECK(ncclParamBind(&nope, "NCCL_NO_SUCH_PARAMETER_XYZ") != ncclSuccess);
}

// ===========================================================================
// Shoal host streams
// ===========================================================================

TEST_CASE("Shoal host streams make host-memory collectives asynchronous", "[api][hoststream]") {
  const int n = 3;
  World w(n);
  std::vector<shoalHostStream_t> hs(n, nullptr);
  for (int r = 0; r < n; ++r) {
    NCCL_OK(shoalHostStreamCreate(&hs[r]));
    REQUIRE(hs[r] != nullptr);
    NCCL_OK(shoalHostStreamQuery(hs[r]));  // a new stream is idle
  }
  const TypeInfo& t = typeOf(ncclFloat32);
  const size_t N = 100003;
  std::vector<Buf> send, mid, out;
  for (int r = 0; r < n; ++r) {
    send.emplace_back(t, N);
    mid.emplace_back(t, N);
    out.emplace_back(t, N);
    send[r].fill([r](size_t i) { return val(r, i); });
  }
  // No group: with a host stream each call returns at once, so one thread can
  // drive every rank. The second operation reads the first one's output
  // (stream order).
  for (int r = 0; r < n; ++r) {
    auto stream = reinterpret_cast<cudaStream_t>(hs[r]);
    NCCL_OK(ncclAllReduce(send[r].at(), mid[r].at(), N, ncclFloat, ncclSum, w[r], stream));
    NCCL_OK(ncclAllReduce(mid[r].at(), out[r].at(), N, ncclFloat, ncclSum, w[r], stream));
    // Rank 0's work cannot finish before the other ranks call: in progress.
    if (r == 0) CHECK(shoalHostStreamQuery(hs[0]) == ncclInProgress);
  }
  for (int r = 0; r < n; ++r) NCCL_OK(shoalHostStreamSynchronize(hs[r]));
  for (int r = 0; r < n; ++r) {
    NCCL_OK(shoalHostStreamQuery(hs[r]));
    checkBuf(out[r], [n](size_t i) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += val(q, i);
      return s * n;
    }, "host-stream AllReduce of an AllReduce");
  }
  // Grouped operations with host streams.
  std::vector<Buf> g;
  for (int r = 0; r < n; ++r) g.emplace_back(t, N * n);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; ++r)
    NCCL_OK(ncclAllGather(send[r].at(), g[r].at(), N, ncclFloat, w[r], reinterpret_cast<cudaStream_t>(hs[r])));
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < n; ++r) NCCL_OK(shoalHostStreamSynchronize(hs[r]));
  for (int r = 0; r < n; ++r)
    checkBuf(g[r], [N](size_t j) { return val(static_cast<int>(j / N), j % N); }, "host-stream AllGather");
  for (int r = 0; r < n; ++r) NCCL_OK(shoalHostStreamDestroy(hs[r]));
  NCCL_OK(shoalHostStreamDestroy(nullptr));  // shoal.h: NULL is a no-op
  NCCL_EXPECT(shoalHostStreamCreate(nullptr), ncclInvalidArgument);
  requireWorking(w);
}

TEST_CASE("shoalCommDumpState describes a communicator", "[api][diagnostics]") {
  World w(2);
  char buf[4096];
  // After a collective: the communicator, its collectives, its connection to
  // the peer and no error.
  float a[4] = {1, 1, 1, 1}, b[4] = {1, 1, 1, 1};
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(a, a, 4, ncclFloat, ncclSum, w[0], nullptr));
  NCCL_OK(ncclAllReduce(b, b, 4, ncclFloat, ncclSum, w[1], nullptr));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(shoalCommDumpState(w[0], buf, sizeof(buf)));
  const std::string text = buf;
  INFO(text);
  CHECK(text.find("rank 0/2") != std::string::npos);
  CHECK(text.find("collectives issued: 1") != std::string::npos);
  CHECK(text.find("rank 1") != std::string::npos);  // the connection's peer
  CHECK(text.find("async error: none") != std::string::npos);
  // Its hang report (docs/diagnostics.md): nothing in flight, one collective.
  CHECK(text.find("report: {\"shoal_report\": 1, \"reason\": \"request\"") != std::string::npos);
  CHECK(text.find("\"collectives_issued\": 1,") != std::string::npos);
  CHECK(text.find("\"in_flight\": null}") != std::string::npos);
  char tiny[8];
  NCCL_OK(shoalCommDumpState(w[0], tiny, sizeof(tiny)));
  CHECK(std::strlen(tiny) < sizeof(tiny));
  NCCL_EXPECT(shoalCommDumpState(nullptr, buf, sizeof(buf)), ncclInvalidArgument);
  NCCL_EXPECT(shoalCommDumpState(w[0], nullptr, 10), ncclInvalidArgument);
}

// A watchdog dumps the state of a communicator exactly when its calls are
// likely to fail: a dump from another thread while a blocking call reaches
// its deadline and the communicator closes its connections reads no freed
// connection (ASan and TSan runs).
TEST_CASE("shoalCommDumpState from another thread while a failed call closes the connections",
          "[api][diagnostics]") {
  ::setenv("SHOAL_PROGRESS_TIMEOUT_MS", "100", 1);
  ncclResetDebugInit();
  int dumps = 0;
  for (int round = 0; round < 5; ++round) {
    World w(2);
    float a[4] = {1, 1, 1, 1}, b[4] = {1, 1, 1, 1};
    grouped(2, [&](int r) { return ncclAllReduce(r ? b : a, r ? b : a, 4, ncclFloat, ncclSum, w[r], nullptr); });
    std::atomic<bool> stop{false};
    std::thread watchdog([&] {
      char buf[4096];
      while (!stop.load()) {
        if (shoalCommDumpState(w[0], buf, sizeof(buf)) == ncclSuccess) ++dumps;
      }
    });
    // Rank 1 never calls: rank 0 fails at its deadline and closes its connections.
    const ncclResult_t rc = ncclAllReduce(a, a, 4, ncclFloat, ncclSum, w[0], nullptr);
    stop.store(true);
    watchdog.join();
    CHECK(rc != ncclSuccess);
  }
  ::setenv("SHOAL_PROGRESS_TIMEOUT_MS", "30000", 1);
  ncclResetDebugInit();
  CHECK(dumps > 0);
}

TEST_CASE("a count whose byte size overflows is an invalid argument before any byte moves", "[api]") {
  World w(2);
  float buf[4] = {1, 2, 3, 4};
  const size_t huge = SIZE_MAX / 2;  // x 4-byte floats wraps size_t
  auto expectOverflow = [&](ncclResult_t rc, const char* what) {
    INFO(what << ": " << lastError());
    CHECK(rc == ncclInvalidArgument);
    CHECK(lastError().find("overflows") != std::string::npos);
  };
  expectOverflow(ncclAllReduce(buf, buf, huge, ncclFloat, ncclSum, w[0], nullptr), "AllReduce");
  expectOverflow(ncclBroadcast(buf, buf, huge, ncclFloat, 0, w[0], nullptr), "Broadcast");
  expectOverflow(ncclSend(buf, huge, ncclFloat, 1, w[0], nullptr), "Send");
  expectOverflow(ncclRecv(buf, huge, ncclFloat, 1, w[0], nullptr), "Recv");
  // Fits as count x element size, overflows ssize_t as count x element size x ranks.
  const size_t perRank = static_cast<size_t>(SSIZE_MAX) / 4 / 2 + 1;
  expectOverflow(ncclAllGather(buf, buf, perRank, ncclFloat, w[0], nullptr), "AllGather");
  expectOverflow(ncclReduceScatter(buf, buf, perRank, ncclFloat, ncclSum, w[0], nullptr), "ReduceScatter");
  expectOverflow(ncclAlltoAll(buf, buf, perRank, ncclFloat, w[0], nullptr), "AlltoAll");
  // A size just under the limit is not refused for its size (count x 1 byte).
  ncclResult_t rc = ncclAllReduce(nullptr, nullptr, static_cast<size_t>(SSIZE_MAX), ncclInt8, ncclSum, w[0], nullptr);
  CHECK(rc == ncclInvalidArgument);
  CHECK(lastError().find("is NULL") != std::string::npos);  // the NULL buffer, not the size
  // The communicators still work.
  float a[4] = {1, 1, 1, 1}, b[4] = {1, 1, 1, 1};
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(a, a, 4, ncclFloat, ncclSum, w[0], nullptr));
  NCCL_OK(ncclAllReduce(b, b, 4, ncclFloat, ncclSum, w[1], nullptr));
  NCCL_OK(ncclGroupEnd());
  CHECK(a[3] == 2.0f);
}

TEST_CASE("a destroyed or aborted handle is a clear invalid argument - never a read of freed memory", "[api]") {
  ncclComm_t destroyed = nullptr, aborted = nullptr;
  NCCL_OK(ncclCommInitRank(&destroyed, 1, newId(), 0));
  NCCL_OK(ncclCommInitRank(&aborted, 1, newId(), 0));
  NCCL_OK(ncclCommDestroy(destroyed));
  NCCL_OK(ncclCommAbort(aborted));
  float buf[4] = {1, 2, 3, 4};
  for (ncclComm_t dead : {destroyed, aborted}) {
    auto expectDead = [&](ncclResult_t rc, const char* what) {
      INFO(what << ": " << lastError());
      CHECK(rc == ncclInvalidArgument);
      CHECK(lastError().find("was destroyed") != std::string::npos);
    };
    expectDead(ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, dead, nullptr), "AllReduce");
    int count = 0;
    expectDead(ncclCommCount(dead, &count), "CommCount");
    ncclResult_t async = ncclSuccess;
    expectDead(ncclCommGetAsyncError(dead, &async), "GetAsyncError");
    expectDead(ncclCommDestroy(dead), "second destroy");
    expectDead(ncclCommAbort(dead), "abort after destroy");
    char text[64];
    expectDead(shoalCommDumpState(dead, text, sizeof text), "DumpState");
  }
  // Many communicators later the library still works (dead handles are
  // reused only after a quarantine, and never freed).
  for (int i = 0; i < 50; ++i) {
    ncclComm_t c = nullptr;
    NCCL_OK(ncclCommInitRank(&c, 1, newId(), 0));
    NCCL_OK(ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, c, nullptr));
    NCCL_OK(ncclCommDestroy(c));
  }
  CHECK(buf[3] == 4.0f);
}

// The parent keeps working after a default shrink, with the rank it left
// out (alive, elsewhere) too: that rank never took the shrink's turn, and
// still meets the others at their next shrink, which excludes another rank.
TEST_CASE("a rank left out of a default shrink takes part in the parent's next shrink", "[api][elastic]") {
  shoal::testing::ScopedEnv shortSetup{{"SHOAL_INIT_TIMEOUT_MS", "10000"}};
  World w(3);
  auto shrinkEach = [&](int excluded, std::vector<ncclComm_t>& out) {
    std::vector<ncclResult_t> rcs(3, ncclSuccess);
    std::vector<std::string> why(3);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 3; ++r) {
      if (r == excluded) continue;
      ranks.emplace_back([&, r] {
        int list[1] = {excluded};
        rcs[r] = ncclCommShrink(w[r], list, 1, &out[r], nullptr, NCCL_SHRINK_DEFAULT);
        if (rcs[r] != ncclSuccess) why[r] = lastError();
      });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < 3; ++r) {
      INFO("shrink excluding " << excluded << ", rank " << r << ": " << why[r]);
      CHECK(rcs[r] == ncclSuccess);
    }
  };
  std::vector<ncclComm_t> first(3, nullptr), second(3, nullptr);
  shrinkEach(2, first);
  requireWorking(w);  // all three ranks of the parent, rank 2 included
  shrinkEach(1, second);
  // Ranks 0 and 2 of the parent are ranks 0 and 1 of the second child.
  std::vector<std::thread> ranks;
  float sums[3] = {0, 0, 0};
  for (int r : {0, 2})
    ranks.emplace_back([&, r] {
      float mine = static_cast<float>(r + 1);
      if (second[r] != nullptr &&
          ncclAllReduce(&mine, &sums[r], 1, ncclFloat, ncclSum, second[r], nullptr) != ncclSuccess)
        sums[r] = -1;
    });
  for (auto& t : ranks) t.join();
  CHECK(sums[0] == 4.0f);
  CHECK(sums[2] == 4.0f);
  for (auto* list : {&first, &second})
    for (ncclComm_t c : *list)
      if (c != nullptr) NCCL_OK(ncclCommDestroy(c));
}

// NCCL_COMM_BLOCKING=0 overrides every communicator's config, the default
// one that ncclCommInitAll gives its ranks included: an operation returns
// ncclInProgress at once and completes in the background.
TEST_CASE("NCCL_COMM_BLOCKING=0 makes the communicators of ncclCommInitAll nonblocking", "[api][nonblocking]") {
  shoal::testing::ScopedEnv env{{"NCCL_COMM_BLOCKING", "0"}};
  World w(2);
  float in[2] = {1, 2}, out[2] = {0, 0};
  // Rank 0 alone: a blocking call would wait here for rank 1.
  NCCL_EXPECT(ncclAllReduce(&in[0], &out[0], 1, ncclFloat, ncclSum, w[0], nullptr), ncclInProgress);
  NCCL_EXPECT(ncclAllReduce(&in[1], &out[1], 1, ncclFloat, ncclSum, w[1], nullptr), ncclInProgress);
  for (int r = 0; r < 2; ++r) NCCL_OK(waitAsync(w[r]));
  CHECK(out[0] == 3.0f);
  CHECK(out[1] == 3.0f);
}

// Ranks that disagree on the communicator's size, or two that claim one
// rank, fail within seconds on every side, each naming the cause, rather
// than the ranks still waiting for a rank that will never come waiting for
// the set-up deadline.
TEST_CASE("a rank given another nranks, or a rank claimed twice, fails every rank's init within seconds",
          "[api][errors]") {
  shoal::testing::ScopedEnv longSetup{{"SHOAL_INIT_TIMEOUT_MS", "60000"}};
  struct Case {
    const char* name;
    int nranks[2];
    int rank[2];
    const char* keyword[2];
  };
  const Case cases[] = {
      {"rank 1 says nranks=3", {2, 3}, {0, 1}, {"initialized with nranks=3", "initialized with nranks=3"}},
      {"two processes claim rank 0", {2, 2}, {0, 0}, {"claims rank 0", "claims rank 0"}},
  };
  for (const Case& k : cases) {
    INFO(k.name);
    const ncclUniqueId id = newId();
    ncclResult_t rcs[2] = {ncclSuccess, ncclSuccess};
    std::string why[2];
    double ms[2] = {0, 0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&, t] {
        const auto t0 = Clock::now();
        ncclComm_t comm = nullptr;
        rcs[t] = ncclCommInitRank(&comm, k.nranks[t], id, k.rank[t]);
        ms[t] = msSince(t0);
        why[t] = lastError();
        if (comm != nullptr) (void)ncclCommDestroy(comm);
      });
    for (auto& th : threads) th.join();
    for (int t = 0; t < 2; ++t) {
      INFO("thread " << t << " after " << ms[t] << " ms: " << why[t]);
      CHECK(rcs[t] == ncclInvalidUsage);
      CHECK(ms[t] < 20000);
      CHECK(why[t].find(k.keyword[t]) != std::string::npos);
    }
  }
}
