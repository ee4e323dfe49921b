// CUDA for the perf benchmarks' device-memory mode (--memory device).
//
// Role: the benchmark's own CUDA calls: binding a rank thread to a device,
// its stream, and the copies that fill and read back device buffers. The
// benchmark links no CUDA library: the driver API is loaded at run time,
// dlopen(SHOAL_CUDA_DRIVER or "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL), so
// that the NCCL library in the same process, which only looks for a driver
// the process already has, finds the same one; every entry point comes from
// cuGetProcAddress_v2 as of CUDA 12.0. Device memory itself comes from
// ncclMemAlloc (with a context current it is device memory) and is never
// dereferenced here: data goes through host buffers and copies.
//
// Built without CUDA's headers (CMake's SHOAL_HAVE_CUDA off), loadDriver()
// reports "built without CUDA" and nothing else is ever called.
//
// Threads: loadDriver and the device queries are for the main thread, before
// rank threads start; a RankDevice belongs to the rank thread that made it.
// Any CUDA failure prints where and why and ends the job (Process::abortJob).
#pragma once

#include <nccl.h>

#include <cstddef>
#include <functional>
#include <string>

namespace shoal::perf {

// Loads and initializes the driver (cuInit), once per process; "" when it is
// usable, else why not ("built without CUDA", "libcuda.so.1: cannot open
// shared object file", "cuInit failed: CUDA_ERROR_NO_DEVICE ...").
std::string loadDriver();
// The library loadDriver opened (SHOAL_CUDA_DRIVER or libcuda.so.1).
std::string driverPath();
// Devices the loaded driver reports.
int deviceCount();
// "[0000:07:00] NVIDIA H200", as nccl-tests prints a rank's device.
std::string describeDevice(int ordinal);

// One rank thread's device: the device's primary context, made current on
// the constructing thread (as cudaSetDevice does), and the stream its
// operations go to.
class RankDevice {
 public:
  // `nullStream`: use the NULL (legacy default) stream instead of creating a
  // non-blocking one (-y 1).
  RankDevice(int ordinal, bool nullStream);
  // Synchronizes and destroys the stream and releases the context.
  ~RankDevice();
  RankDevice(const RankDevice&) = delete;
  RankDevice& operator=(const RankDevice&) = delete;

  int ordinal() const { return ordinal_; }
  cudaStream_t stream() const { return stream_; }

  // Waits for everything queued on the stream.
  void synchronize();
  // Synchronous, in stream order: each queues its work on the stream and
  // waits for the stream, so earlier operations are done before and the
  // bytes are in place after.
  void copyToDevice(void* device, const void* host, size_t bytes);
  void copyToHost(void* host, const void* device, size_t bytes);
  void fill(void* device, unsigned char value, size_t bytes);

  // CUDA graphs (-G): captures what `calls` enqueue on the stream into a
  // graph (thread-local capture mode, as nccl-tests), made ready to launch;
  // launchGraph enqueues one launch on the stream; dropGraph destroys it.
  void captureGraph(const std::function<void()>& calls);
  void launchGraph();
  void dropGraph();

 private:
  int ordinal_;
  void* context_ = nullptr;         // CUcontext
  cudaStream_t stream_ = nullptr;   // nullptr: the NULL stream
  bool ownsStream_ = false;
  void* graph_ = nullptr;           // CUgraph
  void* graphExec_ = nullptr;       // CUgraphExec
};

}  // namespace shoal::perf
