// Command line of the perf benchmarks; see options.h.
#include "options.h"

#include <getopt.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace shoal::perf {
namespace {

enum LongOnly { kCsv = 1000, kJson, kProcs, kMemory };

constexpr struct option kLongOptions[] = {
    {"nthreads", required_argument, nullptr, 't'},
    {"ngpus", required_argument, nullptr, 'g'},
    {"minbytes", required_argument, nullptr, 'b'},
    {"maxbytes", required_argument, nullptr, 'e'},
    {"stepbytes", required_argument, nullptr, 'i'},
    {"stepfactor", required_argument, nullptr, 'f'},
    {"iters", required_argument, nullptr, 'n'},
    {"agg_iters", required_argument, nullptr, 'm'},
    {"warmup_iters", required_argument, nullptr, 'w'},
    {"run_cycles", required_argument, nullptr, 'N'},
    {"parallel_init", required_argument, nullptr, 'p'},
    {"check", required_argument, nullptr, 'c'},
    {"op", required_argument, nullptr, 'o'},
    {"datatype", required_argument, nullptr, 'd'},
    {"root", required_argument, nullptr, 'r'},
    {"blocking", required_argument, nullptr, 'z'},
    {"stream_null", required_argument, nullptr, 'y'},
    {"timeout", required_argument, nullptr, 'T'},
    {"cudagraph", required_argument, nullptr, 'G'},
    {"report_cputime", required_argument, nullptr, 'C'},
    {"average", required_argument, nullptr, 'a'},
    {"output_file", required_argument, nullptr, 'J'},
    {"unalign", required_argument, nullptr, 'u'},
    {"local_register", required_argument, nullptr, 'R'},
    {"cta_policy", required_argument, nullptr, 'x'},
    {"device_implementation", required_argument, nullptr, 'D'},
    {"csv", required_argument, nullptr, kCsv},
    {"json", required_argument, nullptr, kJson},
    {"procs", required_argument, nullptr, kProcs},
    {"memory", required_argument, nullptr, kMemory},
    {"help", no_argument, nullptr, 'h'},
    {nullptr, 0, nullptr, 0},
};
constexpr char kShortOptions[] = "t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:a:J:u:R:x:D:h";

void printUsage(const char* program) {
  std::printf(
      "USAGE: %s\n"
      "\t[-t,--nthreads <rank threads per process>]\n"
      "\t[--procs <processes to fork, no MPI needed; ranks = procs x threads>]\n"
      "\t[--memory <host/device/auto: buffers in host memory or CUDA device memory; auto = device "
      "when a CUDA driver reports a device>]\n"
      "\t[-g,--ngpus <ranks per thread: 1>]\n"
      "\t[-b,--minbytes <min size in bytes, K/M/G suffixes>]\n"
      "\t[-e,--maxbytes <max size in bytes>]\n"
      "\t[-i,--stepbytes <increment size>]\n"
      "\t[-f,--stepfactor <increment factor>]\n"
      "\t[-n,--iters <iteration count>]\n"
      "\t[-m,--agg_iters <aggregated iteration count>]\n"
      "\t[-w,--warmup_iters <warmup iteration count>]\n"
      "\t[-N,--run_cycles <cycle count> run & print each cycle (0 = forever)]\n"
      "\t[-p,--parallel_init <0/1>]\n"
      "\t[-c,--check <check iteration count>]\n"
      "\t[-o,--op <sum/prod/min/max/avg/mulsum/all>]\n"
      "\t[-d,--datatype <int8/uint8/int32/uint32/int64/uint64/half/float/double/bfloat16/"
      "f8e4m3/f8e5m2/all>]\n"
      "\t[-r,--root <root, -1 for all roots>]\n"
      "\t[-z,--blocking <0: no, 1: barrier after each op, 2: no barrier, "
      "3: barrier per iteration, not timed>]\n"
      "\t[-y,--stream_null <0/1: device memory on the NULL stream instead of a created one; host "
      "memory always uses NULL>]\n"
      "\t[-T,--timeout <seconds without progress before aborting>]\n"
      "\t[-G,--cudagraph <launches of a CUDA graph of each size's timed calls (device memory, -z 0)>]\n"
      "\t[-C,--report_cputime <0/1>]\n"
      "\t[-a,--average <0: rank 0, 1: avg, 2: min, 3: max>]\n"
      "\t[-u,--unalign <misalign buffers by this many elements>]\n"
      "\t[-R,--local_register <0/1/2: 1 ncclCommRegister, 2 ncclCommWindowRegister (symmetric) the buffers>]\n"
      "\t[-x,--cta_policy <ncclConfig_t.CTAPolicy>]\n"
      "\t[-J,--output_file <JSON file>] [--json <JSON file>] [--csv <CSV file>]\n"
      "\t[-h,--help]\n",
      program);
}

// Parses a whole decimal or 0x-prefixed integer.
bool parseInt(const char* text, long min, long max, long* out) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0' || value < min || value > max) return false;
  *out = value;
  return true;
}

// nccl-tests' sizes: a number with an optional K, M or G (powers of 1024).
bool parseSize(const char* text, size_t* out) {
  double value = 0;
  char unit = '\0';
  char extra = '\0';
  const int fields = std::sscanf(text, "%lf%c%c", &value, &unit, &extra);
  if (fields < 1 || fields > 2 || !(value >= 0)) return false;  // also rejects NaN
  double scale = 1;
  if (fields == 2) {
    switch (unit) {
      case 'K': case 'k': scale = 1024.0; break;
      case 'M': case 'm': scale = 1024.0 * 1024; break;
      case 'G': case 'g': scale = 1024.0 * 1024 * 1024; break;
      default: return false;
    }
  }
  constexpr double kLargest = 1ull << 50;  // a petabyte: beyond any buffer
  if (value * scale > kLargest) return false;
  *out = static_cast<size_t>(value * scale);
  return true;
}

}  // namespace

ParseResult parseOptions(int argc, char** argv, int ncclVersion, bool verbose) {
  Options options;
  const char* program = argv[0];
  const char* opName = "sum";
  const char* typeName = "float";
  auto fail = [&](const char* what, const char* value) {
    if (verbose) {
      if (value != nullptr) {
        std::printf("invalid %s '%s'\n", what, value);
      } else {
        std::printf("invalid %s\n", what);
      }
      printUsage(program);
    }
    return ParseResult{std::nullopt, 1};
  };

  optind = 0;  // glibc: start a new scan from scratch
  opterr = verbose ? 1 : 0;  // getopt's own messages too: one process prints
  for (;;) {
    const int c = getopt_long(argc, argv, kShortOptions, kLongOptions, nullptr);
    if (c == -1) break;
    long value = 0;
    switch (c) {
      case 't':
        if (!parseInt(optarg, 1, 4096, &value)) return fail("thread count (-t)", optarg);
        options.threads = static_cast<int>(value);
        break;
      case 'g':
        // Each rank thread drives exactly one communicator here.
        if (!parseInt(optarg, 1, 1, &value)) return fail("GPUs per thread (-g, only 1)", optarg);
        break;
      case 'b':
        if (!parseSize(optarg, &options.minBytes)) return fail("size for 'minbytes'", optarg);
        break;
      case 'e':
        if (!parseSize(optarg, &options.maxBytes)) return fail("size for 'maxbytes'", optarg);
        break;
      case 'i':
        if (!parseSize(optarg, &options.stepBytes)) return fail("step size (-i)", optarg);
        break;
      case 'f':
        if (!parseInt(optarg, 1, 1 << 20, &value)) return fail("step factor (-f)", optarg);
        options.stepFactor = static_cast<size_t>(value);
        break;
      case 'n':
        if (!parseInt(optarg, 1, 1 << 30, &value)) return fail("iteration count (-n)", optarg);
        options.iters = static_cast<int>(value);
        break;
      case 'm':
        if (!parseInt(optarg, 1, 1 << 20, &value)) return fail("aggregation count (-m)", optarg);
        options.aggIters = static_cast<int>(value);
        break;
      case 'w':
        if (!parseInt(optarg, 0, 1 << 30, &value)) return fail("warmup count (-w)", optarg);
        options.warmupIters = static_cast<int>(value);
        break;
      case 'N':
        if (!parseInt(optarg, 0, 1 << 30, &value)) return fail("cycle count (-N)", optarg);
        options.runCycles = static_cast<int>(value);
        break;
      case 'p':
        if (!parseInt(optarg, 0, 1, &value)) return fail("parallel init (-p)", optarg);
        options.parallelInit = value != 0;
        break;
      case 'c':
        if (!parseInt(optarg, 0, 1 << 20, &value)) return fail("check count (-c)", optarg);
        options.check = static_cast<int>(value);
        break;
      case 'o':
        opName = optarg;
        break;
      case 'd':
        typeName = optarg;
        break;
      case 'r':
        if (!parseInt(optarg, -1, 1 << 30, &value)) return fail("root (-r)", optarg);
        options.root = static_cast<int>(value);
        break;
      case 'z':
        if (!parseInt(optarg, 0, 3, &value)) return fail("blocking mode (-z)", optarg);
        options.blocking = static_cast<int>(value);
        break;
      case 'y':
        if (!parseInt(optarg, 0, 1, &value)) return fail("stream_null (-y)", optarg);
        options.streamNull = value != 0;
        break;
      case 'T':
        if (!parseInt(optarg, 0, 1 << 30, &value)) return fail("timeout (-T)", optarg);
        options.timeoutSeconds = static_cast<int>(value);
        break;
      case 'G':
        if (!parseInt(optarg, 0, 1 << 20, &value)) return fail("cudagraph launches (-G)", optarg);
        options.graphLaunches = static_cast<int>(value);
        break;
      case 'C':
        if (!parseInt(optarg, 0, 1, &value)) return fail("report_cputime (-C)", optarg);
        options.reportCpuTime = value != 0;
        break;
      case 'a':
        if (!parseInt(optarg, 0, 3, &value)) return fail("average mode (-a)", optarg);
        options.average = static_cast<TimeAggregation>(value);
        break;
      case 'J':
      case kJson:
        options.jsonPath = optarg;
        break;
      case kCsv:
        options.csvPath = optarg;
        break;
      case kProcs:
        if (!parseInt(optarg, 1, kMaxProcs, &value)) return fail("process count (--procs)", optarg);
        options.procs = static_cast<int>(value);
        break;
      case kMemory:
        if (std::strcmp(optarg, "host") == 0) {
          options.memory = MemoryMode::kHost;
        } else if (std::strcmp(optarg, "device") == 0) {
          options.memory = MemoryMode::kDevice;
        } else if (std::strcmp(optarg, "auto") == 0) {
          options.memory = MemoryMode::kAuto;
        } else {
          return fail("memory (--memory host, device or auto)", optarg);
        }
        break;
      case 'u':
        if (!parseInt(optarg, 0, 1 << 20, &value)) return fail("unalign (-u)", optarg);
        options.unalign = static_cast<int>(value);
        break;
      case 'R':
        // 2 (symmetric windows) serves NCCL's device API, which Shoal lacks.
        if (!parseInt(optarg, 0, 2, &value)) return fail("local_register (-R, 0, 1 or 2)", optarg);
        options.registerBuffers = value;
        break;
      case 'x':
        if (!parseInt(optarg, 0, 2, &value)) return fail("CTA policy (-x)", optarg);
        options.ctaPolicy = static_cast<int>(value);
        break;
      case 'D':
        if (!parseInt(optarg, 0, 0, &value)) return fail("device implementation (-D, only 0)", optarg);
        break;
      case 'h':
        if (verbose) printUsage(program);
        return ParseResult{std::nullopt, 0};
      default:
        if (verbose) printUsage(program);
        return ParseResult{std::nullopt, 1};
    }
  }
  if (optind < argc) return fail("argument", argv[optind]);
  if (options.minBytes > options.maxBytes) return fail("size range: minbytes > maxbytes", nullptr);
  if (options.stepFactor <= 1 && options.stepBytes == 0) return fail("step: 0 bytes", nullptr);
  // A graph captures calls on a stream: nothing may wait inside the loop,
  // and host memory has no stream.
  if (options.graphLaunches > 0 && options.blocking != 0) return fail("-G with -z other than 0", nullptr);
  if (options.graphLaunches > 0 && options.memory == MemoryMode::kHost)
    return fail("-G with --memory host (graphs capture calls on device memory)", nullptr);

  // "all" means what both this benchmark and the library know.
  if (std::strcmp(opName, "all") == 0) {
    options.allOps = true;
    for (const OpInfo& op : allReductionOps()) {
      if (op.minVersion <= ncclVersion) options.ops.push_back(op.op);
    }
  } else if (const OpInfo* op = findOp(opName)) {
    options.ops.push_back(op->op);
  } else {
    return fail("op", opName);
  }
  if (std::strcmp(typeName, "all") == 0) {
    options.allTypes = true;
    for (const TypeInfo& type : allTypes()) {
      if (type.minVersion <= ncclVersion) options.types.push_back(type.type);
    }
  } else if (const TypeInfo* type = findType(typeName)) {
    options.types.push_back(type->type);
  } else {
    return fail("datatype", typeName);
  }
  return ParseResult{options, 0};
}

int procsInArgs(int argc, char** argv) {
  // getopt_long permutes the array it scans: scan a copy.
  std::vector<char*> args(argv, argv + argc);
  args.push_back(nullptr);
  const int savedOpterr = opterr;
  opterr = 0;  // parseOptions reports bad options
  optind = 0;  // glibc: start a new scan from scratch
  int procs = 1;
  for (;;) {
    const int c = getopt_long(argc, args.data(), kShortOptions, kLongOptions, nullptr);
    if (c == -1) break;
    if (c != kProcs) continue;
    long value = 0;
    procs = parseInt(optarg, 1, kMaxProcs, &value) ? static_cast<int>(value) : 1;
  }
  opterr = savedOpterr;
  optind = 0;
  return procs;
}

}  // namespace shoal::perf
