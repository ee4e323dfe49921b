// Self test of the CUDA driver stand-in (libshoal_cudafake.so): checks its
// semantics through the driver API it exports, so that tests of Shoal built on
// it can trust what it models (see README.md).
//
// Test cases tagged [.child] are hidden: they run only in a fresh process that
// a visible test starts (runChild: fork + exec of this same executable), for
// what a process can do once only (calls before cuInit, knobs read at cuInit)
// or must do in a clean process (exit with a blocked stream, a peer importing
// shared memory).

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fake_cuda.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kGranularity = size_t{2} << 20;

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

// ---------------------------------------------------------------------------
// Helpers.

CUcontext useDevice(int ordinal = 0) {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, ordinal) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  return ctx;
}

double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Polls pred until it holds or `timeout` passes.
bool eventually(const std::function<bool()>& pred, milliseconds timeout = milliseconds(10000)) {
  const auto end = Clock::now() + timeout;
  while (!pred()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

template <class T>
T loadAcquire(T* p) {
  return std::atomic_ref<T>(*p).load(std::memory_order_acquire);
}

template <class T>
void storeRelease(T* p, T v) {
  std::atomic_ref<T>(*p).store(v, std::memory_order_release);
}

struct Stream {
  CUstream h = nullptr;
  Stream() { REQUIRE(cuStreamCreate(&h, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS); }
  ~Stream() {
    cuStreamSynchronize(h);
    cuStreamDestroy(h);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

struct DeviceBuffer {
  CUdeviceptr p = 0;
  explicit DeviceBuffer(size_t n) { REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS); }
  ~DeviceBuffer() { cuMemFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct PinnedBuffer {
  void* p = nullptr;
  explicit PinnedBuffer(size_t n) {
    REQUIRE(cuMemHostAlloc(&p, n, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS);
    std::memset(p, 0, n);
  }
  ~PinnedBuffer() { cuMemFreeHost(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
  CUdeviceptr dev() const { return reinterpret_cast<CUdeviceptr>(p); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
};

// Exit status as a number: exit code, or 128 + signal number.
int decodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Waits for pid up to `timeout`; kills it past that and returns -1.
int waitChild(pid_t pid, milliseconds timeout = milliseconds(60000)) {
  const auto end = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return decodeStatus(status);
    if (r < 0) return -1;
    if (Clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
}

// Runs `body` in a forked copy of this process; it ends with _exit(body()).
// No core files: some children are meant to die by a signal.
int runForked(const std::function<int()>& body) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    struct rlimit noCore = {0, 0};
    setrlimit(RLIMIT_CORE, &noCore);
    signal(SIGSEGV, SIG_DFL);  // Catch's handlers would report, not just die
    signal(SIGABRT, SIG_DFL);
    _exit(body());
  }
  return waitChild(pid);
}

// Runs the hidden test case `name` in a fresh process (this executable),
// with extra environment entries; `keepFd` stays open across exec.
int runChild(const std::string& name, const std::vector<std::string>& extraEnv = {}, int keepFd = -1) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  for (const auto& e : extraEnv) env.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  std::string arg = name;
  std::string quiet = "--reporter=compact";
  char* argv[] = {exe.data(), arg.data(), quiet.data(), nullptr};
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (keepFd >= 0) fcntl(keepFd, F_SETFD, 0);
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  return waitChild(pid);
}

// Returns false on failure (callable from any thread: no Catch assertions).
bool sendFd(int sock, int fd) {
  char byte = 'F';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  return sendmsg(sock, &msg, 0) == 1;
}

int recvFd(int sock) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (recvmsg(sock, &msg, 0) != 1) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

// A stream wait on *word with (value, flags), followed by a write of 1 to
// *done: true if the write happened within `ms`.
template <class T>
bool waitPasses(CUstream s, T* word, T initial, T value, unsigned flags, uint32_t* done, int ms) {
  storeRelease(word, initial);
  storeRelease<uint32_t>(done, 0);
  CUdeviceptr w = reinterpret_cast<CUdeviceptr>(word);
  CUresult r = sizeof(T) == 8 ? cuStreamWaitValue64(s, w, value, flags)
                              : cuStreamWaitValue32(s, w, static_cast<cuuint32_t>(value), flags);
  REQUIRE(r == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(s, reinterpret_cast<CUdeviceptr>(done), 1, 0) == CUDA_SUCCESS);
  return eventually([&] { return loadAcquire(done) == 1; }, milliseconds(ms));
}

const char kWaitKernelPtx[] =
    "//\n"
    ".version 8.0\n"
    ".target sm_90\n"
    ".address_size 64\n"
    ".visible .entry shoal_wait_u64(\n"
    "    .param .u64 word, .param .u64 value, .param .u64 abortWord)\n"
    "{\n"
    "    ret;\n"
    "}\n";

CUresult launchWait(CUfunction f, CUstream s, CUdeviceptr word, uint64_t value, CUdeviceptr abortWord) {
  void* params[] = {&word, &value, &abortWord};
  return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr);
}

}  // namespace

// ===========================================================================
// Initialisation and knobs (fresh processes).

TEST_CASE("child: calls before cuInit", "[.child]") {
  CHECK(shoalFakeCudaCallCount("cuInit") == 0);
  int version = 0;
  CHECK(cuDriverGetVersion(&version) == CUDA_SUCCESS);
  CHECK(version == 13000);
  const char* text = nullptr;
  CHECK(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &text) == CUDA_SUCCESS);
  CHECK(std::string(text) == "invalid argument");
  CHECK(cuGetErrorName(CUDA_ERROR_NOT_READY, &text) == CUDA_SUCCESS);
  CHECK(std::string(text) == "CUDA_ERROR_NOT_READY");
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  CHECK(cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS);
  CHECK(fn == reinterpret_cast<void*>(&cuMemAlloc_v2));

  int count = -1;
  CUdeviceptr p = 0;
  CUstream s = nullptr;
  CHECK(cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(cuMemAlloc(&p, 64) == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(cuStreamCreate(&s, 0) == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(shoalFakeCudaCallCount("cuDeviceGetCount") == 1);  // refused calls are counted too

  CHECK(cuInit(1) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CHECK(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  CHECK(count == 1);
  CHECK(shoalFakeCudaCallCount("cuInit") == 2);
}

TEST_CASE("child: environment knobs", "[.child]") {
  CHECK(cuInit(0) == CUDA_ERROR_UNKNOWN);  // SHOAL_FAKECUDA_FAIL=cuInit:1
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  int count = 0;
  REQUIRE(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  CHECK(count == 3);
  int memops = -1;
  REQUIRE(cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 2) == CUDA_SUCCESS);
  CHECK(memops == 0);
  useDevice(2);
  PinnedBuffer word(64);
  CHECK(cuStreamWriteValue32(nullptr, word.dev(), 1, 0) == CUDA_ERROR_NOT_SUPPORTED);
  CUmodule mod = nullptr;
  CHECK(cuModuleLoadData(&mod, kWaitKernelPtx) == CUDA_ERROR_NOT_SUPPORTED);

  CUdeviceptr a = 0, b = 0, c = 0;
  CHECK(cuMemAlloc(&a, 256) == CUDA_SUCCESS);
  CHECK(cuMemAlloc(&b, 256) == CUDA_ERROR_UNKNOWN);  // SHOAL_FAKECUDA_FAIL=cuMemAlloc:2
  CHECK(b == 0);
  CHECK(cuMemAlloc(&c, 256) == CUDA_SUCCESS);

  // SHOAL_FAKECUDA_STREAM_DELAY_MS=60: each of three operations waits 60 ms.
  Stream s;
  auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) REQUIRE(cuMemsetD8Async(a, 1, 256, s.h) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s.h) == CUDA_SUCCESS);
  CHECK(msSince(t0) >= 180.0);
  cuMemFree(a);
  cuMemFree(c);
}

TEST_CASE("child: no devices", "[.child]") { CHECK(cuInit(0) == CUDA_ERROR_NO_DEVICE); }

TEST_CASE("child: two devices", "[.child]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  int count = 0;
  REQUIRE(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  REQUIRE(count == 2);
  CUuuid u0{}, u1{};
  REQUIRE(cuDeviceGetUuid(&u0, 0) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetUuid(&u1, 1) == CUDA_SUCCESS);
  CHECK(std::memcmp(u0.bytes, u1.bytes, 16) != 0);
  char bus[32];
  REQUIRE(cuDeviceGetPCIBusId(bus, sizeof bus, 1) == CUDA_SUCCESS);
  CHECK(std::string(bus) == "0000:01:00.0");
  CUcontext c0 = useDevice(0);
  CUcontext c1 = useDevice(1);
  CHECK(c0 != c1);
  CUdevice dev = -1;
  REQUIRE(cuCtxGetDevice(&dev) == CUDA_SUCCESS);
  CHECK(dev == 1);
  int peer = -1;
  REQUIRE(cuDeviceCanAccessPeer(&peer, 0, 1) == CUDA_SUCCESS);
  CHECK(peer == 1);
  // Memory belongs to the device of the context current at allocation.
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 128) == CUDA_SUCCESS);
  int ordinal = -1;
  REQUIRE(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) == CUDA_SUCCESS);
  CHECK(ordinal == 1);
  cuMemFree(p);
}

TEST_CASE("cudafake: entry points refuse work before cuInit", "[cudafake]") {
  CHECK(runChild("child: calls before cuInit") == 0);
}

TEST_CASE("cudafake: environment knobs take effect at cuInit", "[cudafake]") {
  CHECK(runChild("child: environment knobs",
                 {"SHOAL_FAKECUDA_DEVICES=3", "SHOAL_FAKECUDA_NO_MEMOPS=1", "SHOAL_FAKECUDA_NO_KERNELS=1",
                  "SHOAL_FAKECUDA_FAIL=cuInit:1,cuMemAlloc:2", "SHOAL_FAKECUDA_STREAM_DELAY_MS=60"}) == 0);
  CHECK(runChild("child: no devices", {"SHOAL_FAKECUDA_DEVICES=0"}) == 0);
  CHECK(runChild("child: two devices", {"SHOAL_FAKECUDA_DEVICES=2"}) == 0);
}

// ===========================================================================
// Devices and contexts.

TEST_CASE("cudafake: devices report a stable identity and attributes", "[cudafake]") {
  useDevice();
  CUuuid a{}, b{};
  REQUIRE(cuDeviceGetUuid(&a, 0) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetUuid(&b, 0) == CUDA_SUCCESS);
  CHECK(std::memcmp(a.bytes, b.bytes, 16) == 0);
  // Another process sees the same UUID for device 0.
  int pipeFds[2];
  REQUIRE(pipe(pipeFds) == 0);
  const int status = runForked([&] {
        CUuuid u{};
        if (cuDeviceGetUuid(&u, 0) != CUDA_SUCCESS) return 1;
        return write(pipeFds[1], u.bytes, 16) == 16 ? 0 : 2;
      });
  CHECK(status == 0);
  CUuuid fromChild{};
  REQUIRE(read(pipeFds[0], fromChild.bytes, 16) == 16);
  close(pipeFds[0]);
  close(pipeFds[1]);
  CHECK(std::memcmp(a.bytes, fromChild.bytes, 16) == 0);

  auto attr = [](CUdevice_attribute which) {
    int v = -1;
    REQUIRE(cuDeviceGetAttribute(&v, which, 0) == CUDA_SUCCESS);
    return v;
  };
  CHECK(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) == 9);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) == 0);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) == 132);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) == 1);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) == 1);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 1);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) == 1);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) == 0);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED) == 0);
  int v = 0;
  CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 1) == CUDA_ERROR_INVALID_DEVICE);

  char bus[32];
  REQUIRE(cuDeviceGetPCIBusId(bus, sizeof bus, 0) == CUDA_SUCCESS);
  CHECK(std::string(bus) == "0000:00:00.0");
  char name[128];
  REQUIRE(cuDeviceGetName(name, sizeof name, 0) == CUDA_SUCCESS);
  CHECK(std::string(name).find("fake") != std::string::npos);
  size_t total = 0;
  REQUIRE(cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS);
  CHECK(total > 0);
}

TEST_CASE("cudafake: contexts are per thread with a push and pop stack", "[cudafake]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext primary = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS);
  std::thread([&] {
    CUdevice dev = -1;
    CUcontext cur = primary;
    CHECK(cuCtxGetDevice(&dev) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cuCtxGetCurrent(&cur) == CUDA_SUCCESS);
    CHECK(cur == nullptr);
    CHECK(cuCtxSynchronize() == CUDA_ERROR_INVALID_CONTEXT);
    CUcontext popped = nullptr;
    CHECK(cuCtxPopCurrent(&popped) == CUDA_ERROR_INVALID_CONTEXT);

    CHECK(cuCtxPushCurrent(primary) == CUDA_SUCCESS);
    CHECK(cuCtxGetDevice(&dev) == CUDA_SUCCESS);
    CHECK(dev == 0);
    CHECK(cuCtxPopCurrent(&popped) == CUDA_SUCCESS);
    CHECK(popped == primary);
    CHECK(cuCtxGetDevice(&dev) == CUDA_ERROR_INVALID_CONTEXT);

    CHECK(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
    CHECK(cuCtxGetCurrent(&cur) == CUDA_SUCCESS);
    CHECK(cur == primary);
    CHECK(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);  // pops
    CHECK(cuCtxGetCurrent(&cur) == CUDA_SUCCESS);
    CHECK(cur == nullptr);
    CHECK(cuCtxSetCurrent(reinterpret_cast<CUcontext>(&dev)) == CUDA_ERROR_INVALID_CONTEXT);
  }).join();
  unsigned flags = 0;
  int active = 0;
  REQUIRE(cuDevicePrimaryCtxGetState(0, &flags, &active) == CUDA_SUCCESS);
  CHECK(active == 1);
  CHECK(cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS);
}

// ===========================================================================
// Memory.

TEST_CASE("cudafake: device memory faults on host access and round-trips through copies", "[cudafake]") {
  useDevice();
  const int before = shoalFakeCudaLiveAllocations();
  constexpr size_t kBytes = 10000;
  CUdeviceptr dev = 0;
  REQUIRE(cuMemAlloc(&dev, kBytes) == CUDA_SUCCESS);
  CHECK(shoalFakeCudaLiveAllocations() == before + 1);

  // The address the caller holds is PROT_NONE: a host read kills the process.
  const int status = runForked([&] {
    volatile const char* p = reinterpret_cast<const char*>(dev);
    return p[17] == 0 ? 10 : 11;  // never gets here
  });
  CHECK(status == 128 + SIGSEGV);

  std::vector<unsigned char> in(kBytes), out(kBytes, 0);
  for (size_t i = 0; i < kBytes; ++i) in[i] = static_cast<unsigned char>(i * 7 + 1);
  REQUIRE(cuMemcpyHtoD(dev, in.data(), kBytes) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoH(out.data(), dev, kBytes) == CUDA_SUCCESS);
  CHECK(out == in);

  DeviceBuffer other(kBytes);
  REQUIRE(cuMemcpyDtoD(other.p, dev, kBytes) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD8(dev + 100, 0xab, 50) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD32(dev + 200, 0x01020304u, 4) == CUDA_SUCCESS);
  REQUIRE(cuMemcpy(reinterpret_cast<CUdeviceptr>(out.data()), dev, kBytes) == CUDA_SUCCESS);
  CHECK(out[99] == in[99]);
  CHECK(out[100] == 0xab);
  CHECK(out[149] == 0xab);
  CHECK(out[150] == in[150]);
  uint32_t word = 0;
  std::memcpy(&word, out.data() + 212, 4);
  CHECK(word == 0x01020304u);
  REQUIRE(cuMemcpyDtoH(out.data(), other.p, kBytes) == CUDA_SUCCESS);
  CHECK(out == in);  // the DtoD copy predates the memsets

  // Past the end, misaligned, or out of nowhere: refused at once.
  CHECK(cuMemcpyHtoD(dev + 1, in.data(), kBytes) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpyDtoH(out.data(), dev, kBytes + 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemsetD32(dev + 2, 0, 1) == CUDA_ERROR_INVALID_VALUE);
  Stream s;
  CHECK(cuMemcpyAsync(dev + kBytes - 8, reinterpret_cast<CUdeviceptr>(in.data()), 16, s.h) == CUDA_ERROR_INVALID_VALUE);

  // Managed memory is host accessible.
  CUdeviceptr managed = 0;
  REQUIRE(cuMemAllocManaged(&managed, 4096, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  std::memset(reinterpret_cast<void*>(managed), 0x5a, 4096);
  REQUIRE(cuMemcpyDtoH(out.data(), managed, 64) == CUDA_SUCCESS);
  CHECK(out[63] == 0x5a);
  CHECK(cuMemFree(managed) == CUDA_SUCCESS);

  CHECK(cuMemFree(dev + 8) == CUDA_ERROR_INVALID_VALUE);  // not the base
  CHECK(cuMemFree(dev) == CUDA_SUCCESS);
  CHECK(cuMemFree(dev) == CUDA_ERROR_INVALID_VALUE);  // twice
  CHECK(shoalFakeCudaLiveAllocations() == before + 1);  // `other` remains
}

TEST_CASE("cudafake: pointer attributes describe every kind of memory", "[cudafake]") {
  CUcontext ctx = useDevice();
  struct Attrs {
    unsigned type = 99;
    int managed = 99;
    int ordinal = 99;
    CUcontext ctx = reinterpret_cast<CUcontext>(1);
    CUdeviceptr devPtr = 1;
    void* hostPtr = reinterpret_cast<void*>(1);
    CUdeviceptr start = 1;
    size_t size = 1;
  };
  auto query = [](CUdeviceptr p) {
    Attrs a;
    CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,    CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_CONTEXT,
                                   CU_POINTER_ATTRIBUTE_DEVICE_POINTER, CU_POINTER_ATTRIBUTE_HOST_POINTER,
                                   CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    void* data[] = {&a.type, &a.managed, &a.ordinal, &a.ctx, &a.devPtr, &a.hostPtr, &a.start, &a.size};
    REQUIRE(cuPointerGetAttributes(8, which, data, p) == CUDA_SUCCESS);
    return a;
  };

  DeviceBuffer dev(1000);
  Attrs d = query(dev.p + 10);
  CHECK(d.type == CU_MEMORYTYPE_DEVICE);
  CHECK(d.managed == 0);
  CHECK(d.ordinal == 0);
  CHECK(d.ctx == ctx);
  CHECK(d.devPtr == dev.p + 10);
  CHECK(d.hostPtr == nullptr);
  CHECK(d.start == dev.p);
  CHECK(d.size == 1000);

  CUdeviceptr managed = 0;
  REQUIRE(cuMemAllocManaged(&managed, 300, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  Attrs m = query(managed);
  CHECK(m.type == CU_MEMORYTYPE_DEVICE);
  CHECK(m.managed == 1);
  CHECK(m.hostPtr == reinterpret_cast<void*>(managed));
  CHECK(m.size == 300);
  cuMemFree(managed);

  PinnedBuffer pinned(500);
  Attrs p = query(pinned.dev() + 499);
  CHECK(p.type == CU_MEMORYTYPE_HOST);
  CHECK(p.managed == 0);
  CHECK(p.ordinal == 0);
  CHECK(p.ctx == ctx);
  CHECK(p.hostPtr == pinned.as<char>() + 499);
  CHECK(p.start == pinned.dev());

  std::vector<char> heap(4096);
  REQUIRE(cuMemHostRegister(heap.data(), heap.size(), 0) == CUDA_SUCCESS);
  Attrs r = query(reinterpret_cast<CUdeviceptr>(heap.data() + 5));
  CHECK(r.type == CU_MEMORYTYPE_HOST);
  CHECK(r.size == 4096);
  REQUIRE(cuMemHostUnregister(heap.data()) == CUDA_SUCCESS);

  int onStack = 0;
  Attrs u = query(reinterpret_cast<CUdeviceptr>(&onStack));
  CHECK(u.type == 0);
  CHECK(u.managed == 0);
  CHECK(u.ordinal == -2);
  CHECK(u.ctx == nullptr);
  CHECK(u.devPtr == 0);
  CHECK(u.hostPtr == nullptr);
  CHECK(u.size == 0);
  unsigned type = 0;
  CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(&onStack)) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev.p) == CUDA_SUCCESS);
  CHECK(type == CU_MEMORYTYPE_DEVICE);
}

TEST_CASE("cudafake: pinned host memory registration and device pointers", "[cudafake]") {
  useDevice();
  void* p = nullptr;
  REQUIRE(cuMemHostAlloc(&p, 8192, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS);
  static_cast<char*>(p)[8191] = 1;  // ordinary host memory
  unsigned flags = 0;
  REQUIRE(cuMemHostGetFlags(&flags, p) == CUDA_SUCCESS);
  CHECK(flags == (CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  CUdeviceptr dp = 0;
  REQUIRE(cuMemHostGetDevicePointer(&dp, static_cast<char*>(p) + 64, 0) == CUDA_SUCCESS);
  CHECK(dp == reinterpret_cast<CUdeviceptr>(static_cast<char*>(p) + 64));
  CHECK(cuMemHostRegister(p, 4096, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CHECK(cuMemFreeHost(p) == CUDA_SUCCESS);
  CHECK(cuMemFreeHost(p) == CUDA_ERROR_INVALID_VALUE);

  void* q = nullptr;
  REQUIRE(cuMemAllocHost(&q, 100) == CUDA_SUCCESS);
  CHECK(cuMemFreeHost(q) == CUDA_SUCCESS);

  std::vector<char> heap(1 << 16);
  CHECK(cuMemHostGetDevicePointer(&dp, heap.data(), 0) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemHostRegister(heap.data(), heap.size(), CU_MEMHOSTREGISTER_DEVICEMAP) == CUDA_SUCCESS);
  REQUIRE(cuMemHostGetDevicePointer(&dp, heap.data(), 0) == CUDA_SUCCESS);
  CHECK(dp == reinterpret_cast<CUdeviceptr>(heap.data()));
  CHECK(cuMemHostRegister(heap.data() + 100, 10, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CHECK(cuMemHostUnregister(heap.data() + 1) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  CHECK(cuMemHostUnregister(heap.data()) == CUDA_SUCCESS);
  CHECK(cuMemHostUnregister(heap.data()) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

// ===========================================================================
// Streams, memory operations, events, host functions.

TEST_CASE("cudafake: one stream publishes copied bytes before a later write value", "[cudafake]") {
  useDevice();
  constexpr size_t kBytes = size_t{8} << 20;
  PinnedBuffer src(kBytes), dst(kBytes), flag(64);
  DeviceBuffer dev(kBytes);
  std::memset(src.p, 0x3c, kBytes);
  Stream s;
  // Hold the stream so the host is certainly watching before anything runs.
  REQUIRE(shoalFakeCudaStreamDelay(s.h, 100) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyHtoDAsync(dev.p, src.p, kBytes, s.h) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoHAsync(dst.p, dev.p, kBytes, s.h) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(s.h, flag.dev(), 1, 0) == CUDA_SUCCESS);
  CHECK(loadAcquire(flag.as<uint32_t>()) == 0);  // the enqueue did not run it
  CHECK(cuStreamQuery(s.h) == CUDA_ERROR_NOT_READY);

  bool allThere = false;
  std::thread watcher([&] {
    while (loadAcquire(flag.as<uint32_t>()) == 0) std::this_thread::yield();
    // The flag is seen: every byte of the two copies before it is visible.
    const unsigned char* d = dst.as<unsigned char>();
    allThere = true;
    for (size_t i = 0; i < kBytes; i += 511) allThere = allThere && d[i] == 0x3c;
    allThere = allThere && d[kBytes - 1] == 0x3c;
  });
  watcher.join();
  CHECK(allThere);
  REQUIRE(cuStreamSynchronize(s.h) == CUDA_SUCCESS);
  CHECK(cuStreamQuery(s.h) == CUDA_SUCCESS);
}

TEST_CASE("cudafake: a wait value blocks later stream work until the host stores", "[cudafake]") {
  useDevice();
  PinnedBuffer words(64);
  uint32_t* flag = words.as<uint32_t>();
  uint32_t* done = words.as<uint32_t>() + 1;
  Stream s;
  auto t0 = Clock::now();
  REQUIRE(cuStreamWaitValue32(s.h, reinterpret_cast<CUdeviceptr>(flag), 1, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(s.h, reinterpret_cast<CUdeviceptr>(done), 7, 0) == CUDA_SUCCESS);
  CHECK(msSince(t0) < 1000.0);  // the caller is not blocked (else it would never get here)
  std::this_thread::sleep_for(milliseconds(100));
  CHECK(loadAcquire(done) == 0);
  CHECK(cuStreamQuery(s.h) == CUDA_ERROR_NOT_READY);
  storeRelease<uint32_t>(flag, 1);
  REQUIRE(cuStreamSynchronize(s.h) == CUDA_SUCCESS);
  CHECK(loadAcquire(done) == 7);

  // Device memory words work too (through the stand-in's alias mapping).
  DeviceBuffer devWord(64);
  REQUIRE(cuMemsetD32(devWord.p, 0, 16) == CUDA_SUCCESS);
  Stream other;
  REQUIRE(cuStreamWaitValue64(s.h, devWord.p + 8, 42, CU_STREAM_WAIT_VALUE_EQ) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(s.h, reinterpret_cast<CUdeviceptr>(done), 8, 0) == CUDA_SUCCESS);
  std::this_thread::sleep_for(milliseconds(50));
  CHECK(loadAcquire(done) == 7);
  REQUIRE(cuStreamWriteValue64(other.h, devWord.p + 8, 42, 0) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s.h) == CUDA_SUCCESS);
  CHECK(loadAcquire(done) == 8);

  CHECK(cuStreamWaitValue32(s.h, reinterpret_cast<CUdeviceptr>(flag) + 2, 1, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuStreamWaitValue32(s.h, reinterpret_cast<CUdeviceptr>(flag), 1, 0x10) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuStreamWriteValue32(s.h, reinterpret_cast<CUdeviceptr>(flag), 1, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) ==
        CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("cudafake: wait value conditions are cyclic GEQ and EQ and AND and NOR", "[cudafake]") {
  useDevice();
  PinnedBuffer words(64);
  uint32_t* w32 = words.as<uint32_t>();
  uint32_t* done = words.as<uint32_t>() + 1;
  uint64_t* w64 = words.as<uint64_t>() + 1;
  Stream s;
  constexpr int kPass = 5000;  // ms to wait for a wait that must pass
  constexpr int kBlock = 60;   // ms a wait that must block is watched

  auto blocksThenPasses32 = [&](uint32_t initial, uint32_t value, unsigned flags, uint32_t release) {
    bool blocked = !waitPasses<uint32_t>(s.h, w32, initial, value, flags, done, kBlock);
    storeRelease(w32, release);
    bool released = eventually([&] { return loadAcquire(done) == 1; });
    return blocked && released;
  };

  // GEQ is cyclic: (int32_t)(*addr - value) >= 0.
  CHECK(waitPasses<uint32_t>(s.h, w32, 5, 3, CU_STREAM_WAIT_VALUE_GEQ, done, kPass));
  CHECK(waitPasses<uint32_t>(s.h, w32, 2, 0xfffffff0u, CU_STREAM_WAIT_VALUE_GEQ, done, kPass));  // ahead across wrap
  CHECK(blocksThenPasses32(3, 5, CU_STREAM_WAIT_VALUE_GEQ, 5));
  CHECK(blocksThenPasses32(0xfffffff0u, 0x10, CU_STREAM_WAIT_VALUE_GEQ, 0x10));  // behind across wrap
  CHECK(blocksThenPasses32(4, 5, CU_STREAM_WAIT_VALUE_EQ, 5));
  CHECK(blocksThenPasses32(6, 5, CU_STREAM_WAIT_VALUE_EQ, 5));
  CHECK(blocksThenPasses32(0x2, 0x1, CU_STREAM_WAIT_VALUE_AND, 0x3));
  CHECK(blocksThenPasses32(0xffffffffu, 0, CU_STREAM_WAIT_VALUE_NOR, 0xfffffffeu));
  CHECK(waitPasses<uint32_t>(s.h, w32, 0, 0, CU_STREAM_WAIT_VALUE_NOR, done, kPass));

  // 64-bit: cyclic over 64 bits.
  CHECK(waitPasses<uint64_t>(s.h, w64, 1, ~uint64_t{0}, CU_STREAM_WAIT_VALUE_GEQ, done, kPass));
  CHECK(!waitPasses<uint64_t>(s.h, w64, ~uint64_t{0} - 15, 0x10, CU_STREAM_WAIT_VALUE_GEQ, done, kBlock));
  storeRelease<uint64_t>(w64, uint64_t{1} << 40);  // far ahead: passes
  CHECK(eventually([&] { return loadAcquire(done) == 1; }));

  // The same through cuStreamBatchMemOp: wait 64, then write 32.
  storeRelease<uint64_t>(w64, 0);
  storeRelease<uint32_t>(done, 0);
  CUstreamBatchMemOpParams ops[2] = {};
  ops[0].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
  ops[0].waitValue.address = reinterpret_cast<CUdeviceptr>(w64);
  ops[0].waitValue.value64 = 9;
  ops[0].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[1].writeValue.address = reinterpret_cast<CUdeviceptr>(done);
  ops[1].writeValue.value = 1;
  REQUIRE(cuStreamBatchMemOp(s.h, 2, ops, 0) == CUDA_SUCCESS);
  std::this_thread::sleep_for(milliseconds(kBlock));
  CHECK(loadAcquire(done) == 0);
  storeRelease<uint64_t>(w64, 9);
  CHECK(eventually([&] { return loadAcquire(done) == 1; }));
  ops[1].operation = static_cast<CUstreamBatchMemOpType>(77);
  CHECK(cuStreamBatchMemOp(s.h, 2, ops, 0) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("cudafake: events order work across two streams", "[cudafake]") {
  useDevice();
  PinnedBuffer words(64);
  uint32_t* x = words.as<uint32_t>();
  Stream a, b;
  CUevent ev = nullptr, start = nullptr, never = nullptr;
  REQUIRE(cuEventCreate(&ev, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  REQUIRE(cuEventCreate(&start, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  REQUIRE(cuEventCreate(&never, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);

  REQUIRE(cuEventRecord(start, a.h) == CUDA_SUCCESS);
  REQUIRE(shoalFakeCudaStreamDelay(a.h, 150) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(a.h, reinterpret_cast<CUdeviceptr>(x), 1, 0) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(ev, a.h) == CUDA_SUCCESS);
  CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY);

  struct Seen {
    uint32_t* x;
    std::atomic<int> value{-1};
  } seen{x, {}};
  REQUIRE(cuStreamWaitEvent(b.h, ev, 0) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(
              b.h, [](void* p) {
                auto* s = static_cast<Seen*>(p);
                s->value = static_cast<int>(loadAcquire(s->x));
              },
              &seen) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(b.h) == CUDA_SUCCESS);
  CHECK(seen.value == 1);  // b ran only after a's write
  CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
  REQUIRE(cuEventSynchronize(ev) == CUDA_SUCCESS);
  float ms = 0;
  REQUIRE(cuEventElapsedTime(&ms, start, ev) == CUDA_SUCCESS);
  CHECK(ms >= 140.0f);
  CHECK(cuEventElapsedTime(&ms, start, never) == CUDA_ERROR_INVALID_HANDLE);

  // An event never recorded is complete: waiting on it holds nothing.
  CHECK(cuEventQuery(never) == CUDA_SUCCESS);
  CHECK(cuEventSynchronize(never) == CUDA_SUCCESS);
  REQUIRE(shoalFakeCudaStreamDelay(a.h, 1500) == CUDA_SUCCESS);  // a is busy for long
  REQUIRE(cuStreamWaitEvent(b.h, never, 0) == CUDA_SUCCESS);
  auto t0 = Clock::now();
  REQUIRE(cuStreamSynchronize(b.h) == CUDA_SUCCESS);
  CHECK(msSince(t0) < 700.0);

  // cuCtxSynchronize waits for all streams of the context, including a.
  REQUIRE(cuStreamWriteValue32(a.h, reinterpret_cast<CUdeviceptr>(x), 2, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK(loadAcquire(x) == 2);
  CHECK(msSince(t0) >= 1400.0);

  CHECK(cuEventDestroy(ev) == CUDA_SUCCESS);
  CHECK(cuEventDestroy(ev) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuEventQuery(ev) == CUDA_ERROR_INVALID_HANDLE);
  cuEventDestroy(start);
  cuEventDestroy(never);
}

TEST_CASE("cudafake: host functions run in stream order and may not call CUDA", "[cudafake]") {
  useDevice();
  Stream s;
  struct Log {
    std::mutex mu;
    std::vector<int> order;
    CUresult fromInside = CUDA_SUCCESS;
    CUstream stream = nullptr;
  } log;
  log.stream = s.h;
  struct Item {
    Log* log;
    int n;
  };
  std::vector<Item> items;
  for (int i = 0; i < 5; ++i) items.push_back({&log, i});
  for (auto& item : items) {
    REQUIRE(cuLaunchHostFunc(
                s.h, [](void* p) {
                  auto* it = static_cast<Item*>(p);
                  std::lock_guard lk(it->log->mu);
                  it->log->order.push_back(it->n);
                },
                &item) == CUDA_SUCCESS);
  }
  REQUIRE(cuStreamSynchronize(s.h) == CUDA_SUCCESS);
  CHECK(log.order == std::vector<int>{0, 1, 2, 3, 4});

  const unsigned long long before = shoalFakeCudaHostFnViolations();
  REQUIRE(cuLaunchHostFunc(
              s.h, [](void* p) { static_cast<Log*>(p)->fromInside = cuStreamQuery(static_cast<Log*>(p)->stream); },
              &log) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s.h) == CUDA_SUCCESS);
  CHECK(log.fromInside == CUDA_ERROR_NOT_PERMITTED);
  CHECK(shoalFakeCudaHostFnViolations() == before + 1);

  // Strict mode aborts the process.
  CHECK(runChild("child: strict host functions", {"SHOAL_FAKECUDA_STRICT_HOSTFN=1"}) == 128 + SIGABRT);
}

TEST_CASE("child: strict host functions", "[.child]") {
  useDevice();
  signal(SIGABRT, SIG_DFL);  // die of the abort, without Catch's report
  struct rlimit noCore = {0, 0};
  setrlimit(RLIMIT_CORE, &noCore);
  Stream s;
  REQUIRE(cuLaunchHostFunc(
              s.h, [](void*) { cuCtxSynchronize(); }, nullptr) == CUDA_SUCCESS);
  cuStreamSynchronize(s.h);
  FAIL("a CUDA call from a host function did not abort in strict mode");
}

TEST_CASE("cudafake: the memops switch makes stream memory operations unsupported", "[cudafake]") {
  useDevice();
  PinnedBuffer words(64);
  Stream s;
  shoalFakeCudaSetMemOps(0);
  int v = -1;
  CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 0) == CUDA_SUCCESS);
  CHECK(v == 0);
  CHECK(cuStreamWriteValue32(s.h, words.dev(), 1, 0) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuStreamWriteValue64(s.h, words.dev(), 1, 0) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuStreamWaitValue32(s.h, words.dev(), 0, 0) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuStreamWaitValue64(s.h, words.dev(), 0, 0) == CUDA_ERROR_NOT_SUPPORTED);
  CUstreamBatchMemOpParams op = {};
  op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op.writeValue.address = words.dev();
  CHECK(cuStreamBatchMemOp(s.h, 1, &op, 0) == CUDA_ERROR_NOT_SUPPORTED);
  shoalFakeCudaSetMemOps(1);
  CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 0) == CUDA_SUCCESS);
  CHECK(v == 1);
  CHECK(cuStreamWriteValue32(s.h, words.dev(), 1, 0) == CUDA_SUCCESS);
}

TEST_CASE("cudafake: fail nth makes exactly that call fail without effect", "[cudafake]") {
  useDevice();
  PinnedBuffer src(64), dst(64);
  std::memset(src.p, 1, 64);
  Stream s;
  shoalFakeCudaFailNth("cuMemcpyAsync", 2);
  CHECK(cuMemcpyAsync(dst.dev(), src.dev(), 16, s.h) == CUDA_SUCCESS);
  CHECK(cuMemcpyAsync(dst.dev() + 16, src.dev(), 16, s.h) == CUDA_ERROR_UNKNOWN);
  CHECK(cuMemcpyAsync(dst.dev() + 32, src.dev(), 16, s.h) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s.h) == CUDA_SUCCESS);
  CHECK(dst.as<char>()[0] == 1);
  CHECK(dst.as<char>()[16] == 0);  // the failed copy did nothing
  CHECK(dst.as<char>()[32] == 1);

  // A versioned name means the same function; n = 0 clears.
  shoalFakeCudaFailNth("cuMemAlloc_v2", 1);
  shoalFakeCudaFailNth("cuMemAlloc", 0);
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 64) == CUDA_SUCCESS);
  cuMemFree(p);
  shoalFakeCudaFailNth("cuMemAlloc_v2", 1);
  const int live = shoalFakeCudaLiveAllocations();
  CHECK(cuMemAlloc(&p, 64) == CUDA_ERROR_UNKNOWN);
  CHECK(shoalFakeCudaLiveAllocations() == live);
}

TEST_CASE("cudafake: stream delays hold later work", "[cudafake]") {
  useDevice();
  PinnedBuffer words(64);
  Stream s;
  auto t0 = Clock::now();
  REQUIRE(shoalFakeCudaStreamDelay(s.h, 200) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(s.h, words.dev(), 1, 0) == CUDA_SUCCESS);
  std::this_thread::sleep_for(milliseconds(100));
  CHECK(loadAcquire(words.as<uint32_t>()) == 0);
  CHECK(cuStreamQuery(s.h) == CUDA_ERROR_NOT_READY);
  REQUIRE(cuStreamSynchronize(s.h) == CUDA_SUCCESS);
  CHECK(msSince(t0) >= 200.0);
  CHECK(loadAcquire(words.as<uint32_t>()) == 1);

  shoalFakeCudaSetStreamDelayMs(50);  // before every operation, on every stream
  t0 = Clock::now();
  for (int i = 0; i < 4; ++i) REQUIRE(cuStreamWriteValue32(s.h, words.dev(), 2, 0) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s.h) == CUDA_SUCCESS);
  shoalFakeCudaSetStreamDelayMs(0);
  CHECK(msSince(t0) >= 200.0);
}

TEST_CASE("cudafake: capture records work and each launch of its graph replays it", "[cudafake]") {
  useDevice();
  PinnedBuffer words(64);
  Stream s;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  REQUIRE(cuStreamIsCapturing(s.h, &status) == CUDA_SUCCESS);
  CHECK(status == CU_STREAM_CAPTURE_STATUS_NONE);
  REQUIRE(cuStreamBeginCapture(s.h, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
  CHECK(cuStreamBeginCapture(s.h, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_ILLEGAL_STATE);
  REQUIRE(cuStreamIsCapturing(s.h, &status) == CUDA_SUCCESS);
  CHECK(status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  cuuint64_t id = 0;
  CUgraph inProgress = reinterpret_cast<CUgraph>(1);
  size_t deps = 9;
  REQUIRE(cuStreamGetCaptureInfo(s.h, &status, &id, &inProgress, nullptr, nullptr, &deps) == CUDA_SUCCESS);
  CHECK(status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CHECK(id != 0);
  CHECK(inProgress != nullptr);  // the graph being captured
  CHECK(deps == 0);

  REQUIRE(cuStreamWriteValue32(s.h, words.dev(), 5, 0) == CUDA_SUCCESS);  // recorded, not run
  CHECK(cuStreamSynchronize(s.h) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(cuStreamQuery(s.h) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(cuCtxSynchronize() == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph = nullptr;
  REQUIRE(cuStreamEndCapture(s.h, &graph) == CUDA_SUCCESS);
  CHECK(graph != nullptr);
  REQUIRE(cuStreamIsCapturing(s.h, &status) == CUDA_SUCCESS);
  CHECK(status == CU_STREAM_CAPTURE_STATUS_NONE);
  REQUIRE(cuStreamSynchronize(s.h) == CUDA_SUCCESS);
  CHECK(loadAcquire(words.as<uint32_t>()) == 0);  // the captured write did not run at capture
  CHECK(graph == inProgress);

  // Each launch replays what was recorded, in order, on the launch stream;
  // a user object retained by the graph lives until the graph and every
  // executable graph made from it are gone.
  struct Tally {
    std::atomic<int> hostCalls{0};
    std::atomic<int> destroyed{0};
  } tally;
  REQUIRE(cuStreamBeginCapture(s.h, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(cuStreamGetCaptureInfo(s.h, &status, &id, &inProgress, nullptr, nullptr, &deps) == CUDA_SUCCESS);
  CUuserObject object = nullptr;
  REQUIRE(cuUserObjectCreate(&object, &tally, [](void* p) { static_cast<Tally*>(p)->destroyed.fetch_add(1); }, 1,
                             CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) == CUDA_SUCCESS);
  REQUIRE(cuGraphRetainUserObject(inProgress, object, 1, CU_GRAPH_USER_OBJECT_MOVE) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(s.h, words.dev(), 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(s.h, [](void* p) { static_cast<Tally*>(p)->hostCalls.fetch_add(1); }, &tally) ==
          CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(s.h, words.dev(), 7, 0) == CUDA_SUCCESS);
  CUgraph second = nullptr;
  REQUIRE(cuStreamEndCapture(s.h, &second) == CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  REQUIRE(cuGraphInstantiate(&exec, second, 0) == CUDA_SUCCESS);
  CHECK(cuGraphDestroy(second) == CUDA_SUCCESS);  // the executable graph keeps its references
  CHECK(tally.destroyed.load() == 0);
  Stream other;
  for (int launch = 1; launch <= 3; ++launch) {
    REQUIRE(cuGraphLaunch(exec, launch == 2 ? other.h : s.h) == CUDA_SUCCESS);
    REQUIRE(cuStreamSynchronize(launch == 2 ? other.h : s.h) == CUDA_SUCCESS);
    CHECK(tally.hostCalls.load() == launch);
    CHECK(loadAcquire(words.as<uint32_t>()) == 7);
  }
  CHECK(tally.destroyed.load() == 0);
  REQUIRE(cuGraphExecDestroy(exec) == CUDA_SUCCESS);
  // The destructor runs later, on a thread of the driver's.
  const auto destroyedBy = Clock::now() + std::chrono::seconds(5);
  while (tally.destroyed.load() == 0 && Clock::now() < destroyedBy) std::this_thread::sleep_for(milliseconds(1));
  CHECK(tally.destroyed.load() == 1);
  CHECK(cuGraphExecDestroy(exec) == CUDA_ERROR_INVALID_VALUE);

  CHECK(cuGraphDestroy(graph) == CUDA_SUCCESS);
  CHECK(cuGraphDestroy(graph) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuStreamEndCapture(s.h, &graph) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(cuStreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);

  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  CHECK(mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
  REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  CHECK(mode == CU_STREAM_CAPTURE_MODE_RELAXED);
}

// cuThreadExchangeStreamCaptureMode's rules for potentially unsafe calls
// (an allocation here): a global-mode capture forbids them on every thread
// in global mode; a thread-local one only on its own thread; relaxed mode
// allows them.
TEST_CASE("cudafake: captures forbid unsafe calls by their modes", "[cudafake]") {
  useDevice();
  CUcontext ctx = nullptr;
  REQUIRE(cuCtxGetCurrent(&ctx) == CUDA_SUCCESS);
  Stream s;
  auto allocOn = [&](bool otherThread, CUstreamCaptureMode mode) {
    CUresult rc = CUDA_ERROR_UNKNOWN;
    auto body = [&] {
      cuCtxSetCurrent(ctx);
      CUstreamCaptureMode m = mode;
      cuThreadExchangeStreamCaptureMode(&m);
      CUdeviceptr p = 0;
      rc = cuMemAlloc(&p, 256);
      if (rc == CUDA_SUCCESS) cuMemFree(p);
      cuThreadExchangeStreamCaptureMode(&m);
    };
    if (otherThread) std::thread(body).join();
    else body();
    return rc;
  };
  REQUIRE(cuStreamBeginCapture(s.h, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CHECK(allocOn(false, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(allocOn(true, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(allocOn(true, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
  CHECK(allocOn(false, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  CUgraph graph = nullptr;
  CUresult wrongThread = CUDA_SUCCESS;
  std::thread([&] { wrongThread = cuStreamEndCapture(s.h, &graph); }).join();
  CHECK(wrongThread == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  REQUIRE(cuStreamEndCapture(s.h, &graph) == CUDA_SUCCESS);
  CHECK(cuGraphDestroy(graph) == CUDA_SUCCESS);
  CHECK(allocOn(true, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);

  REQUIRE(cuStreamBeginCapture(s.h, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
  CHECK(allocOn(false, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(allocOn(true, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(cuStreamEndCapture(s.h, &graph) == CUDA_SUCCESS);
  CHECK(cuGraphDestroy(graph) == CUDA_SUCCESS);
}

// ===========================================================================
// Shareable memory between processes.

TEST_CASE("child: import shared memory", "[.child]") {
  const char* sockEnv = std::getenv("SHOAL_FAKECUDA_TEST_SOCKET");
  REQUIRE(sockEnv != nullptr);
  const int sock = std::atoi(sockEnv);
  useDevice();
  const int fd = recvFd(sock);
  REQUIRE(fd >= 0);
  CUmemGenericAllocationHandle h = 0;
  REQUIRE(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS);
  close(fd);  // the importer keeps its own reference
  CUmemAllocationProp prop{};
  REQUIRE(cuMemGetAllocationPropertiesFromHandle(&prop, h) == CUDA_SUCCESS);
  CHECK(prop.location.id == 0);
  CUdeviceptr va = 0;
  REQUIRE(cuMemAddressReserve(&va, kGranularity, 0, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemMap(va, kGranularity, 0, h, 0) == CUDA_SUCCESS);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  REQUIRE(cuMemSetAccess(va, kGranularity, &access, 1) == CUDA_SUCCESS);
  std::vector<unsigned char> pattern(4096);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 13 + 5);
  REQUIRE(cuMemcpyHtoD(va + 8192, pattern.data(), pattern.size()) == CUDA_SUCCESS);
  REQUIRE(cuMemUnmap(va, kGranularity) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(va, kGranularity) == CUDA_SUCCESS);
  char ack = 'A';
  REQUIRE(write(sock, &ack, 1) == 1);
}

TEST_CASE("cudafake: shareable memory moves between processes over SCM_RIGHTS", "[cudafake]") {
  useDevice();
  const int before = shoalFakeCudaLiveAllocations();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  REQUIRE(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
  CHECK(gran == kGranularity);
  REQUIRE(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS);
  CHECK(gran == kGranularity);

  CUmemGenericAllocationHandle h = 0;
  CHECK(cuMemCreate(&h, kGranularity + 4096, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemCreate(&h, kGranularity, &prop, 0) == CUDA_SUCCESS);
  CUdeviceptr va = 0;
  REQUIRE(cuMemAddressReserve(&va, 2 * kGranularity, 0, 0, 0) == CUDA_SUCCESS);
  CHECK(va % kGranularity == 0);
  REQUIRE(cuMemMap(va + kGranularity, kGranularity, 0, h, 0) == CUDA_SUCCESS);
  CHECK(cuMemMap(va + kGranularity, kGranularity, 0, h, 0) == CUDA_ERROR_INVALID_VALUE);  // already mapped
  CUdeviceptr mapped = va + kGranularity;

  // Not accessible until cuMemSetAccess; the host view is never accessible.
  std::vector<unsigned char> out(4096);
  CHECK(cuMemcpyDtoH(out.data(), mapped, 64) == CUDA_ERROR_ILLEGAL_ADDRESS);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  REQUIRE(cuMemSetAccess(mapped, kGranularity, &access, 1) == CUDA_SUCCESS);
  unsigned long long flags = 0;
  REQUIRE(cuMemGetAccess(&flags, &access.location, mapped + 100) == CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK(runForked([&] { return *reinterpret_cast<volatile char*>(mapped) == 0 ? 10 : 11; }) == 128 + SIGSEGV);
  CHECK(cuMemcpyDtoH(out.data(), va, 64) == CUDA_ERROR_INVALID_VALUE);  // reserved, unmapped

  unsigned type = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
  CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void* data[] = {&type, &start, &size};
  REQUIRE(cuPointerGetAttributes(3, which, data, mapped + 5) == CUDA_SUCCESS);
  CHECK(type == CU_MEMORYTYPE_DEVICE);
  CHECK(start == va);  // the reservation, as cuda.h documents
  CHECK(size == 2 * kGranularity);

  int fd = -1;
  REQUIRE(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
  REQUIRE(fd >= 0);
  int pair[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
  std::atomic<bool> sent{false};
  std::thread sender([&] { sent = sendFd(pair[0], fd); });
  const int status = runChild("child: import shared memory", {"SHOAL_FAKECUDA_TEST_SOCKET=" + std::to_string(pair[1])},
                              pair[1]);
  sender.join();
  CHECK(sent);
  CHECK(status == 0);
  char ack = 0;
  CHECK(read(pair[0], &ack, 1) == 1);
  CHECK(ack == 'A');
  close(pair[0]);
  close(pair[1]);
  close(fd);

  // The peer's writes are in this process's mapping of the same memory.
  REQUIRE(cuMemcpyDtoH(out.data(), mapped + 8192, out.size()) == CUDA_SUCCESS);
  bool same = true;
  for (size_t i = 0; i < out.size(); ++i) same = same && out[i] == static_cast<unsigned char>(i * 13 + 5);
  CHECK(same);

  // A descriptor this stand-in did not export is refused.
  int pipeFds[2];
  REQUIRE(pipe(pipeFds) == 0);
  CUmemGenericAllocationHandle bogus = 0;
  CHECK(cuMemImportFromShareableHandle(&bogus, reinterpret_cast<void*>(static_cast<intptr_t>(pipeFds[0])),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_ERROR_INVALID_VALUE);
  close(pipeFds[0]);
  close(pipeFds[1]);

  CUmemGenericAllocationHandle retained = 0;
  REQUIRE(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(mapped + 64)) == CUDA_SUCCESS);
  CHECK(retained == h);
  CHECK(cuMemRelease(retained) == CUDA_SUCCESS);
  CHECK(cuMemAddressFree(va, 2 * kGranularity) == CUDA_ERROR_INVALID_VALUE);  // still mapped
  CHECK(cuMemRelease(h) == CUDA_SUCCESS);  // the mapping keeps the memory
  REQUIRE(cuMemcpyDtoH(out.data(), mapped + 8192, 16) == CUDA_SUCCESS);
  CHECK(out[1] == static_cast<unsigned char>(18));
  CHECK(cuMemUnmap(va, kGranularity) == CUDA_ERROR_INVALID_VALUE);  // nothing mapped there
  CHECK(cuMemUnmap(mapped, kGranularity) == CUDA_SUCCESS);
  CHECK(cuMemAddressFree(va, 2 * kGranularity) == CUDA_SUCCESS);
  CHECK(shoalFakeCudaLiveAllocations() == before);
}

// ===========================================================================
// The wait kernel.

TEST_CASE("cudafake: the wait kernel holds its stream until the word or the abort flag", "[cudafake]") {
  useDevice();
  CUmodule mod = nullptr;
  CHECK(cuModuleLoadData(&mod, ".version 8.0\n.visible .entry other_kernel()\n{ ret; }\n") == CUDA_ERROR_INVALID_IMAGE);
  REQUIRE(cuModuleLoadData(&mod, kWaitKernelPtx) == CUDA_SUCCESS);
  CUfunction f = nullptr;
  CHECK(cuModuleGetFunction(&f, mod, "other_kernel") == CUDA_ERROR_NOT_FOUND);
  REQUIRE(cuModuleGetFunction(&f, mod, "shoal_wait_u64") == CUDA_SUCCESS);

  PinnedBuffer words(64);
  uint64_t* word = words.as<uint64_t>();
  uint32_t* abortFlag = words.as<uint32_t>() + 2;
  uint32_t* done = words.as<uint32_t>() + 3;
  Stream s;
  storeRelease<uint64_t>(word, 4);
  REQUIRE(launchWait(f, s.h, words.dev(), 5, 0) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(s.h, reinterpret_cast<CUdeviceptr>(done), 1, 0) == CUDA_SUCCESS);
  std::this_thread::sleep_for(milliseconds(60));
  CHECK(loadAcquire(done) == 0);
  storeRelease<uint64_t>(word, 5);
  CHECK(eventually([&] { return loadAcquire(done) == 1; }));

  // A word in device memory, and the abort flag ends the wait instead.
  DeviceBuffer devWord(64);
  REQUIRE(cuMemsetD32(devWord.p, 0, 16) == CUDA_SUCCESS);
  REQUIRE(launchWait(f, s.h, devWord.p, 100, reinterpret_cast<CUdeviceptr>(abortFlag)) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(s.h, reinterpret_cast<CUdeviceptr>(done), 2, 0) == CUDA_SUCCESS);
  std::this_thread::sleep_for(milliseconds(60));
  CHECK(loadAcquire(done) == 1);
  storeRelease<uint32_t>(abortFlag, 1);
  CHECK(eventually([&] { return loadAcquire(done) == 2; }));

  // Cyclic like GEQ, and a device word written by another stream.
  storeRelease<uint32_t>(abortFlag, 0);
  Stream writer;
  REQUIRE(launchWait(f, s.h, devWord.p, 100, reinterpret_cast<CUdeviceptr>(abortFlag)) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(s.h, reinterpret_cast<CUdeviceptr>(done), 3, 0) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue64(writer.h, devWord.p, 101, 0) == CUDA_SUCCESS);
  CHECK(eventually([&] { return loadAcquire(done) == 3; }));

  CHECK(launchWait(f, s.h, devWord.p + 4, 1, 0) == CUDA_ERROR_MISALIGNED_ADDRESS);
  CHECK(cuModuleUnload(mod) == CUDA_SUCCESS);
  CHECK(launchWait(f, s.h, devWord.p, 1, 0) == CUDA_ERROR_INVALID_HANDLE);

  shoalFakeCudaSetKernels(0);
  CHECK(cuModuleLoadData(&mod, kWaitKernelPtx) == CUDA_ERROR_NOT_SUPPORTED);
  shoalFakeCudaSetKernels(1);
}

// ===========================================================================
// Entry points, counters, lifetime.

TEST_CASE("cudafake: cuGetProcAddress resolves base names and calls are counted", "[cudafake]") {
  useDevice();
  struct Case {
    const char* name;
    void* fn;
  };
  const Case cases[] = {
      {"cuMemAlloc", reinterpret_cast<void*>(&cuMemAlloc_v2)},
      {"cuStreamWaitValue64", reinterpret_cast<void*>(&cuStreamWaitValue64_v2)},
      {"cuMemcpyAsync", reinterpret_cast<void*>(&cuMemcpyAsync)},
      {"cuStreamDestroy", reinterpret_cast<void*>(&cuStreamDestroy_v2)},
      {"cuGetErrorString", reinterpret_cast<void*>(&cuGetErrorString)},
      {"cuStreamGetCaptureInfo", reinterpret_cast<void*>(&cuStreamGetCaptureInfo_v3)},
      {"cuGetProcAddress", reinterpret_cast<void*>(&cuGetProcAddress_v2)},
  };
  for (const Case& c : cases) {
    for (cuuint64_t flags : {cuuint64_t{CU_GET_PROC_ADDRESS_DEFAULT}, cuuint64_t{CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM}}) {
      INFO(c.name);
      void* fn = nullptr;
      CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      CHECK(cuGetProcAddress_v2(c.name, &fn, 13000, flags, &status) == CUDA_SUCCESS);
      CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS);
      CHECK(fn == c.fn);
    }
  }
  for (const char* missing : {"cuMemAlloc_v2", "cuNoSuchFunction", "cuGraphAddKernelNode"}) {
    INFO(missing);
    void* fn = reinterpret_cast<void*>(1);
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    CHECK(cuGetProcAddress_v2(missing, &fn, 13000, 0, &status) == CUDA_ERROR_NOT_FOUND);
    CHECK(fn == nullptr);
    CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  }
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  CHECK(cuGetProcAddress_v2("cuMemAlloc", &fn, 11080, 0, &status) == CUDA_ERROR_NOT_FOUND);
  CHECK(status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);

  // Calls through a resolved pointer count under the base name.
  REQUIRE(cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, &status) == CUDA_SUCCESS);
  const unsigned long long before = shoalFakeCudaCallCount("cuMemAlloc");
  CUdeviceptr p = 0;
  REQUIRE(reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(fn)(&p, 64) == CUDA_SUCCESS);
  CHECK(cuMemAlloc(&p + 0, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(shoalFakeCudaCallCount("cuMemAlloc") == before + 2);
  CHECK(shoalFakeCudaCallCount("cuMemAlloc_v2") == before + 2);
  CHECK(shoalFakeCudaCallCount("cuNeverCalled") == 0);
  cuMemFree(p);
}

TEST_CASE("cudafake: destroyed streams drain and leaks are counted", "[cudafake]") {
  useDevice();
  PinnedBuffer words(64);
  const int before = shoalFakeCudaLiveStreams();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreateWithPriority(&s, 0, -100) == CUDA_SUCCESS);
  CHECK(shoalFakeCudaLiveStreams() == before + 1);
  int priority = 0;
  REQUIRE(cuStreamGetPriority(s, &priority) == CUDA_SUCCESS);
  int least = 0, greatest = 0;
  REQUIRE(cuCtxGetStreamPriorityRange(&least, &greatest) == CUDA_SUCCESS);
  CHECK(priority == greatest);  // clamped
  REQUIRE(shoalFakeCudaStreamDelay(s, 1500) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(s, words.dev(), 9, 0) == CUDA_SUCCESS);
  auto t0 = Clock::now();
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
  CHECK(msSince(t0) < 1000.0);  // returns at once, not after the queued 1.5 s
  CHECK(shoalFakeCudaLiveStreams() == before);
  CHECK(cuStreamQuery(s) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuStreamDestroy(s) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuStreamDestroy(nullptr) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(eventually([&] { return loadAcquire(words.as<uint32_t>()) == 9; }));  // its work still ran
}

TEST_CASE("cudafake: synchronous copies follow default stream work", "[cudafake]") {
  useDevice();
  DeviceBuffer dev(256);
  REQUIRE(cuMemsetD8(dev.p, 0, 256) == CUDA_SUCCESS);
  REQUIRE(shoalFakeCudaStreamDelay(CU_STREAM_LEGACY, 100) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD8Async(dev.p, 0x77, 256, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD32Async(dev.p + 4, 0xdeadbeefu, 1, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  unsigned char out[16] = {};
  REQUIRE(cuMemcpyDtoH(out, dev.p, sizeof out) == CUDA_SUCCESS);  // waits for both
  CHECK(out[0] == 0x77);
  uint32_t word = 0;
  std::memcpy(&word, out + 4, 4);
  CHECK(word == 0xdeadbeefu);
}

TEST_CASE("child: exit with a blocked stream", "[.child]") {
  useDevice();
  static uint32_t never = 0;  // static: still valid while the process exits
  REQUIRE(cuMemHostRegister(&never, sizeof never, 0) == CUDA_SUCCESS);
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
  REQUIRE(cuStreamWaitValue32(s, reinterpret_cast<CUdeviceptr>(&never), 1, CU_STREAM_WAIT_VALUE_EQ) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(
              s, [](void*) { std::abort(); }, nullptr) == CUDA_SUCCESS);  // must never run
  REQUIRE(shoalFakeCudaStreamDelay(nullptr, 60000) == CUDA_SUCCESS);  // a default stream asleep too
  // Return with both streams busy: exit must stop them, quickly and cleanly.
}

TEST_CASE("child: fork before streams", "[.child]") {
  useDevice();
  CUdeviceptr dev = 0;
  REQUIRE(cuMemAlloc(&dev, 4096) == CUDA_SUCCESS);
  const int status = runForked([&] {
    CUstream s = nullptr;
    if (cuStreamCreate(&s, 0) != CUDA_SUCCESS) return 1;
    uint32_t in = 0x12345678, out = 0;
    if (cuMemcpyHtoDAsync(dev, &in, 4, s) != CUDA_SUCCESS) return 2;
    if (cuMemcpyDtoHAsync(&out, dev, 4, s) != CUDA_SUCCESS) return 3;
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 4;
    if (out != in) return 5;
    if (cuStreamDestroy(s) != CUDA_SUCCESS) return 6;
    return 0;
  });
  CHECK(status == 0);
  cuMemFree(dev);
}

TEST_CASE("cudafake: process exit and fork leave no worker behind", "[cudafake]") {
  auto t0 = Clock::now();
  CHECK(runChild("child: exit with a blocked stream") == 0);
  CHECK(msSince(t0) < 20000.0);
  CHECK(runChild("child: fork before streams") == 0);

  // Streams do not survive fork: the child gets errors, not hangs, for the
  // parent's streams, and new streams of its own work. ThreadSanitizer cannot
  // run a child that starts threads after a multi-threaded fork.
  if (kThreadSanitizer) {
    WARN("skipped under ThreadSanitizer: streams in a child forked after streams exist");
    return;
  }
  useDevice();
  Stream parentStream;
  PinnedBuffer words(64);
  // The stream's worker is past its start-up before the fork: a thread that
  // allocates at fork() may hold a lock of AddressSanitizer's allocator
  // (GCC 12's does not take them around fork), which the child's own worker
  // would then wait for forever. Once it has run an operation it waits idle.
  REQUIRE(cuStreamWriteValue32(parentStream.h, words.dev(), 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(parentStream.h) == CUDA_SUCCESS);
  const int status = runForked([&] {
    if (cuStreamQuery(parentStream.h) != CUDA_ERROR_INVALID_HANDLE) return 1;
    if (cuStreamWriteValue32(parentStream.h, words.dev(), 1, 0) != CUDA_ERROR_INVALID_HANDLE) return 2;
    CUstream s = nullptr;
    if (cuStreamCreate(&s, 0) != CUDA_SUCCESS) return 3;
    if (cuStreamWriteValue32(s, words.dev(), 2, 0) != CUDA_SUCCESS) return 4;
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 5;
    if (cuStreamSynchronize(nullptr) != CUDA_SUCCESS) return 6;  // a fresh default stream
    return loadAcquire(words.as<uint32_t>()) == 2 ? 0 : 7;
  });
  CHECK(status == 0);
  CHECK(loadAcquire(words.as<uint32_t>()) == 0);  // the child's memory is its own
}
