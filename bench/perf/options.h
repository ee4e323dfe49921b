// Command line of the perf benchmarks: nccl-tests' flags plus --csv and
// --json (README.md, "Flags").
//
// Role: parseOptions turns argv into Options or a reason to stop; it does no
// I/O beyond printing usage and errors, and is called by the main thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "verifiable.h"
#include "world.h"

namespace shoal::perf {

// Where the benchmark's buffers live (--memory).
enum class MemoryMode { kAuto, kHost, kDevice };

struct Options {
  int threads = 1;                // -t: rank threads per process
  int procs = 1;                  // --procs: forked processes (ranks = procs x threads)
  MemoryMode memory = MemoryMode::kAuto;  // --memory
  size_t minBytes = 32u << 20;    // -b
  size_t maxBytes = 32u << 20;    // -e
  size_t stepBytes = 1u << 20;    // -i
  size_t stepFactor = 1;          // -f (used when > 1)
  int iters = 20;                 // -n
  int warmupIters = 1;            // -w
  int aggIters = 1;               // -m: ops per ncclGroupStart/End
  int runCycles = 1;              // -N: 0 repeats forever
  bool parallelInit = false;      // -p: accepted; rank threads always init in parallel
  int check = 1;                  // -c: checked runs per size
  std::vector<Op> ops;            // -o: empty until resolved against the library
  bool allOps = false;
  std::vector<ncclDataType_t> types;  // -d
  bool allTypes = false;
  int root = 0;                   // -r: -1 runs every root
  int blocking = 0;               // -z: 0, 1 (barrier per op), 2, 3 (barrier per iteration)
  bool streamNull = false;        // -y 1: device memory uses the NULL stream; host memory always does
  int timeoutSeconds = 0;         // -T: 0 = none
  bool reportCpuTime = false;     // -C
  int graphLaunches = 0;          // -G: capture each size's timed calls into a CUDA graph, launch it this often
  TimeAggregation average = TimeAggregation::kAverage;  // -a
  int unalign = 0;                // -u: misalign buffers by this many elements
  int registerBuffers = 0;        // -R 1: ncclCommRegister the buffers; 2: ncclCommWindowRegister (symmetric)
  int ctaPolicy = -1;             // -x: ncclConfig_t.CTAPolicy; -1 = unset
  std::string csvPath;            // --csv
  std::string jsonPath;           // --json, -J
};

struct ParseResult {
  std::optional<Options> options;  // empty: stop with exitStatus
  int exitStatus = 0;
};

// Prints usage or errors (to stdout when `verbose`) and returns the options.
// `ncclVersion` (from ncclGetVersion) selects which types and ops "all" means.
ParseResult parseOptions(int argc, char** argv, int ncclVersion, bool verbose);

// The most processes --procs forks.
constexpr int kMaxProcs = 1024;

// The value of --procs in argv as parseOptions will read it (the last one;
// also --procs=N and unambiguous prefixes of the name), without printing
// anything: for Process::init, which forks before the full parse. 1 when the
// option is absent or its value is not in [1, kMaxProcs] (parseOptions then
// reports it). Leaves getopt's state reset.
int procsInArgs(int argc, char** argv);

}  // namespace shoal::perf
