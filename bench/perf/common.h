// Core of the nccl-tests-compatible perf benchmarks (all_reduce_perf, ...).
//
// Role: each benchmark binary is one small file that describes its collective
// as a CollectiveSpec and calls runPerf. runPerf owns everything else:
// flags, launch (MPI or forked processes times rank threads), communicator
// and buffer setup through the public NCCL C API only, timing, data checks,
// and nccl-tests' output plus CSV/JSON (README.md: "Flags", "Timing and
// bandwidth", "Output", 'What "#wrong" means').
//
// Memory (--memory) is host memory from ncclMemAlloc with the NULL stream:
// with Shoal such an operation has completed when the call (or the outermost
// ncclGroupEnd) returns, so time is host wall-clock time; or CUDA device
// memory from ncclMemAlloc with a context current, with each rank's stream
// passed to every call and synchronized before the clock is read.
#pragma once

#include <nccl.h>

#include <cstddef>

#include "verifiable.h"

namespace shoal::perf {

// Buffer sizes of one call, in elements (nccl-tests' getCollByteCount).
struct BufferShape {
  size_t sendCount = 0;          // elements read from the send buffer
  size_t recvCount = 0;          // elements written to the receive buffer
  size_t paramCount = 0;         // the count argument of the NCCL call
  size_t sendInPlaceOffset = 0;  // in place, send = recvbuff + rank * this
  size_t recvInPlaceOffset = 0;  // in place, recv = recvbuff + rank * this
};

// Arguments of one NCCL call.
struct LaunchArgs {
  const void* sendbuff;
  void* recvbuff;
  size_t count;                  // BufferShape::paramCount
  ncclDataType_t type;
  ncclRedOp_t op;                // reductions only
  int root;                      // rooted collectives only; -1 otherwise
  int rank;
  int nranks;
  int ncclVersion;               // of the loaded library (ncclGetVersion)
  ncclComm_t comm;
  cudaStream_t stream;
};

struct CollectiveSpec {
  const char* name;              // "AllReduce", for CSV/JSON
  bool reduces;                  // takes a reduction operator (-o)
  bool rooted;                   // takes a root (-r)
  // nccl-tests does not check in-place results where NCCL does not support
  // in place (AlltoAll, SendRecv): they are still run and timed.
  bool checksInPlace;
  // Only the root's receive buffer is defined (Reduce, Gather).
  bool onlyRootReceives;

  BufferShape (*shape)(size_t count, size_t eltSize, int nranks);
  // Bytes counted by algbw, from the bytes of the count argument (README.md,
  // "Timing and bandwidth").
  double (*algBytes)(double paramBytes, int nranks);
  // busbw = algbw * busBwFactor(nranks) (same section).
  double (*busBwFactor)(int nranks);
  // Where element k of `rank`'s receive region comes from.
  ElementSource (*source)(int rank, size_t k, size_t paramCount, int nranks, int root);
  ncclResult_t (*launch)(const LaunchArgs& args);
  // Optional: adjust the communicator configuration (e.g. maxP2pPeers).
  void (*configure)(ncclConfig_t* config) = nullptr;
};

// Runs the benchmark for `spec` with nccl-tests' command line; returns the
// process exit status (non-zero on a wrong result, an NCCL error, a timeout
// or a bandwidth below NCCL_TESTS_MIN_BW).
int runPerf(int argc, char** argv, const CollectiveSpec& spec);

// Per-rank block of `count` elements split over nranks, rounded down to a
// multiple of 16 bytes as nccl-tests does for AllGather, ReduceScatter,
// AlltoAll, Gather and Scatter.
inline size_t alignedBlockCount(size_t count, size_t eltSize, int nranks) {
  const size_t eltsPer16Bytes = eltSize < 16 ? 16 / eltSize : 1;
  return (count / static_cast<size_t>(nranks)) & ~(eltsPer16Bytes - 1);
}

// busbw factors and algbw byte counts shared by several collectives;
// busBwPeerFraction is (n-1)/n.
inline double busBwOne(int) { return 1.0; }
inline double busBwPeerFraction(int nranks) { return static_cast<double>(nranks - 1) / nranks; }
inline double algBytesOnce(double paramBytes, int) { return paramBytes; }
inline double algBytesPerRank(double paramBytes, int nranks) { return paramBytes * nranks; }

}  // namespace shoal::perf
