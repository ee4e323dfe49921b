// Shared pieces of the peer benchmarks in bench/compare (mpi_coll_bench.cc,
// gloo_coll_bench.cc): options, the size sweep and size arithmetic, the input
// pattern and expected results, and output in the layout of Shoal's
// bench/perf binaries (the nccl-tests table on stdout, and with --csv FILE the
// same CSV columns as `all_reduce_perf --csv`), so one parser reads all three.
//
// Conventions (nccl-tests): float, sum. "size" is the bytes of the full vector
// (allreduce), of the total output (allgather) or of the total input
// (reduce_scatter); the per-rank count of the latter two is size / 4 / nranks
// rounded down to a multiple of 4 elements (16 bytes, as nccl-tests and Shoal's
// perf), so every library runs the same sizes; sizes that round to 0 elements
// are skipped.
// algbw = size / time; busbw = algbw * 2(n-1)/n (allreduce) or * (n-1)/n.
#pragma once

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace compare {

enum class Op { kAllReduce, kAllGather, kReduceScatter };

struct Options {
  Op op = Op::kAllReduce;
  size_t minBytes = 8;
  size_t maxBytes = 64u << 20;
  size_t factor = 2;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  int average = 1;  // 1: mean of the per-rank times, 3: max over ranks
  std::string csvPath;
  std::string algo;       // program specific (-A)
  std::string storeDir;   // Gloo only (--store)
  bool prime = false;     // Gloo only (--prime)
};

// The names Shoal's perf binaries write into the CSV "collective" column.
inline const char* csvName(Op op) {
  switch (op) {
    case Op::kAllReduce: return "AllReduce";
    case Op::kAllGather: return "AllGather";
    case Op::kReduceScatter: return "ReduceScatter";
  }
  return "?";
}

// "none" where the collective does not reduce (as nccl-tests prints it).
inline const char* redopName(Op op) { return op == Op::kAllGather ? "none" : "sum"; }

inline const char* opName(Op op) {
  switch (op) {
    case Op::kAllReduce: return "allreduce";
    case Op::kAllGather: return "allgather";
    case Op::kReduceScatter: return "reduce_scatter";
  }
  return "?";
}

// Parses "8", "64K", "256M", "1G" (powers of 1024, as nccl-tests).
inline bool parseSize(const char* text, size_t* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno || end == text) return false;
  unsigned long long mult = 1;
  switch (*end) {
    case '\0': break;
    case 'k': case 'K': mult = 1ull << 10; ++end; break;
    case 'm': case 'M': mult = 1ull << 20; ++end; break;
    case 'g': case 'G': mult = 1ull << 30; ++end; break;
    default: return false;
  }
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0') return false;
  *out = static_cast<size_t>(v * mult);
  return true;
}

inline void usage(const char* prog, const char* algoHelp) {
  std::fprintf(stderr,
               "usage: %s [-o allreduce|allgather|reduce_scatter] [-b MIN] [-e MAX] [-f FACTOR]\n"
               "          [-n ITERS] [-w WARMUP] [-c 0|1] [-a 1|3] [--csv FILE] %s\n"
               "  sizes take K/M/G suffixes (1024-based); -a 1: time = mean over ranks, 3: max\n",
               prog, algoHelp);
}

// Returns false (after printing why) on a bad command line.
inline bool parseOptions(int argc, char** argv, Options* o, const char* algoHelp) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char** v) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        return false;
      }
      *v = argv[++i];
      return true;
    };
    const char* v = nullptr;
    if (a == "-h" || a == "--help") {
      usage(argv[0], algoHelp);
      std::exit(0);
    } else if (a == "--prime") {
      o->prime = true;
      continue;
    }
    if (!value(&v)) return false;
    bool ok = true;
    if (a == "-o" || a == "--op") {
      const std::string s = v;
      if (s == "allreduce" || s == "all_reduce") o->op = Op::kAllReduce;
      else if (s == "allgather" || s == "all_gather") o->op = Op::kAllGather;
      else if (s == "reduce_scatter" || s == "reducescatter") o->op = Op::kReduceScatter;
      else ok = false;
    } else if (a == "-b" || a == "--minbytes") {
      ok = parseSize(v, &o->minBytes);
    } else if (a == "-e" || a == "--maxbytes") {
      ok = parseSize(v, &o->maxBytes);
    } else if (a == "-f" || a == "--stepfactor") {
      o->factor = std::strtoull(v, nullptr, 10);
      ok = o->factor >= 2;
    } else if (a == "-n" || a == "--iters") {
      o->iters = std::atoi(v);
      ok = o->iters >= 1;
    } else if (a == "-w" || a == "--warmup_iters") {
      o->warmup = std::atoi(v);
      ok = o->warmup >= 0;
    } else if (a == "-c" || a == "--check") {
      o->check = std::atoi(v);
    } else if (a == "-a" || a == "--average") {
      o->average = std::atoi(v);
      ok = o->average == 1 || o->average == 3;
    } else if (a == "--csv") {
      o->csvPath = v;
    } else if (a == "-A" || a == "--algo") {
      o->algo = v;
    } else if (a == "--store") {
      o->storeDir = v;
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      usage(argv[0], algoHelp);
      return false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad value for %s: %s\n", a.c_str(), v);
      return false;
    }
  }
  if (o->minBytes > o->maxBytes) {
    std::fprintf(stderr, "-b is larger than -e\n");
    return false;
  }
  return true;
}

// The element counts of one call.
struct Shape {
  size_t bytes = 0;      // printed size (see the top of this file)
  size_t count = 0;      // the "count" column: full vector / per-rank count
  size_t sendCount = 0;  // elements in each rank's input
  size_t recvCount = 0;  // elements in each rank's output
};

inline Shape shapeFor(Op op, size_t bytes, int nranks) {
  const size_t n = static_cast<size_t>(nranks);
  const size_t elems = bytes / sizeof(float);
  Shape s;
  switch (op) {
    case Op::kAllReduce:
      s.count = s.sendCount = s.recvCount = elems;
      s.bytes = elems * sizeof(float);
      break;
    case Op::kAllGather:
      s.count = s.sendCount = (elems / n) & ~size_t{3};
      s.recvCount = s.count * n;
      s.bytes = s.recvCount * sizeof(float);
      break;
    case Op::kReduceScatter:
      s.count = s.recvCount = (elems / n) & ~size_t{3};
      s.sendCount = s.count * n;
      s.bytes = s.sendCount * sizeof(float);
      break;
  }
  return s;
}

inline std::vector<size_t> sweep(const Options& o) {
  std::vector<size_t> sizes;
  for (size_t size = o.minBytes; size <= o.maxBytes;) {
    sizes.push_back(size);
    const size_t next = size ? size * o.factor : 1;
    if (next <= size) break;
    size = next;
  }
  return sizes;
}

inline double busFactor(Op op, int nranks) {
  const double n = nranks;
  return op == Op::kAllReduce ? 2.0 * (n - 1) / n : (n - 1) / n;
}

// Input element i of rank r: a small integer, so every summation order gives
// the same exact float result.
inline float inputValue(int rank, size_t i) {
  return static_cast<float>((static_cast<size_t>(rank) * 7 + i) % 13 + 1);
}

inline void fillInput(float* buf, size_t count, int rank, size_t offset = 0) {
  for (size_t i = 0; i < count; ++i) buf[i] = inputValue(rank, offset + i);
}

inline float sumOverRanks(int nranks, size_t i) {
  float s = 0;
  for (int r = 0; r < nranks; ++r) s += inputValue(r, i);
  return s;
}

// Wrong elements in this rank's output `out` (recvCount elements).
inline int64_t countWrong(Op op, const Shape& s, const float* out, int rank, int nranks) {
  int64_t wrong = 0;
  for (size_t i = 0; i < s.recvCount; ++i) {
    float expected = 0;
    switch (op) {
      case Op::kAllReduce: expected = sumOverRanks(nranks, i); break;
      case Op::kAllGather:  // block r of the output is rank r's input
        expected = inputValue(static_cast<int>(i / s.count), i % s.count);
        break;
      case Op::kReduceScatter:  // this rank's block of the summed input
        expected = sumOverRanks(nranks, static_cast<size_t>(rank) * s.count + i);
        break;
    }
    if (out[i] != expected) ++wrong;
  }
  return wrong;
}

inline void* allocPages(size_t bytes) {
  const size_t rounded = ((bytes ? bytes : 1) + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, rounded);
  if (!p) {
    std::fprintf(stderr, "out of memory (%zu bytes)\n", rounded);
    std::exit(1);
  }
  std::memset(p, 0, rounded);  // first touch outside the timed region
  return p;
}

struct Measurement {
  double timeUs = 0;
  double algBw = 0;
  double busBw = 0;
  int64_t wrong = -1;  // -1: not checked
};

inline Measurement measurement(Op op, const Shape& s, int nranks, double seconds, int64_t wrong) {
  Measurement m;
  m.timeUs = seconds * 1e6;
  if (seconds > 0) {
    m.algBw = static_cast<double>(s.bytes) / 1e9 / seconds;
    m.busBw = m.algBw * busFactor(op, nranks);
  }
  m.wrong = wrong;
  return m;
}

// Same rule as Shoal's report.cc (and nccl-tests): as many decimals as fit.
inline std::string fitted(double value, int width) {
  int digits = 0;
  for (double power = 1; value >= power && digits < 40; power *= 10) ++digits;
  char text[64];
  if (digits < width - 2) std::snprintf(text, sizeof text, "%*.2f", width, value);
  else if (digits < width - 1) std::snprintf(text, sizeof text, "%*.1f", width, value);
  else if (digits < width + 1) std::snprintf(text, sizeof text, "%*.0f", width, value);
  else std::snprintf(text, sizeof text, "%*.1e", width, value);
  return text;
}

// Rank 0's output: the nccl-tests table and optionally the CSV file.
class Report {
 public:
  Report(const Options& o, std::string program, int nranks, std::string library)
      : o_(o), program_(std::move(program)), nranks_(nranks), library_(std::move(library)) {}

  void header() const {
    std::printf("# %s (bench/compare): %s, %d ranks, float sum, time = %s over ranks\n",
                program_.c_str(), library_.c_str(), nranks_,
                o_.average == 3 ? "max" : "mean");
    std::printf("# minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d iters: %d "
                "validation: %d\n",
                o_.minBytes, o_.maxBytes, o_.factor, o_.warmup, o_.iters, o_.check);
    std::printf("#\n");
    std::printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
                "in-place          \n", "", "", "", "", "");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n",
                "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                "time", "algbw", "busbw", "#wrong");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n",
                "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
                "(GB/s)", "(GB/s)", "");
    std::fflush(stdout);
  }

  // One row; a missing measurement prints as N/A columns (e.g. Gloo's
  // algorithm classes only work in place).
  void row(const Shape& s, const std::optional<Measurement>& outOfPlace,
           const std::optional<Measurement>& inPlace) {
    std::printf("%12zu  %12zu  %8s  %6s  %6i", s.bytes, s.count, "float", redopName(o_.op), -1);
    const std::optional<Measurement>* both[2] = {&outOfPlace, &inPlace};
    for (int k = 0; k < 2; ++k) {
      const std::optional<Measurement>* m = both[k];
      if (!*m) {
        std::printf("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
        continue;
      }
      const Measurement& x = **m;
      if (x.wrong >= 0) {
        std::printf("  %7s  %6s  %6s  %6" PRId64, fitted(x.timeUs, 7).c_str(),
                    fitted(x.algBw, 6).c_str(), fitted(x.busBw, 6).c_str(), x.wrong);
      } else {
        std::printf("  %7s  %6s  %6s    N/A", fitted(x.timeUs, 7).c_str(),
                    fitted(x.algBw, 6).c_str(), fitted(x.busBw, 6).c_str());
      }
      rows_.push_back({s, k == 1, x});
      if (x.wrong > 0) ++failed_;
      busSum_ += x.busBw;
    }
    std::printf("\n");
    std::fflush(stdout);
  }

  // Prints the footer, writes the CSV; returns the exit status.
  int finish() const {
    std::printf("# Out of bounds values : %d %s\n", failed_, failed_ ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g\n", rows_.empty() ? 0.0 : busSum_ / rows_.size());
    std::printf("#\n");
    if (!o_.csvPath.empty()) {
      std::ofstream out(o_.csvPath);
      out << "collective,nranks,bytes,count,type,op,root,in_place,time_us,algbw,busbw,wrong\n";
      for (const Row& r : rows_) {
        char line[256];
        std::snprintf(line, sizeof line, "%s,%d,%zu,%zu,float,%s,-1,%d,%.17g,%.17g,%.17g,",
                      csvName(o_.op), nranks_, r.s.bytes, r.s.count, redopName(o_.op), r.inPlace ? 1 : 0,
                      r.m.timeUs, r.m.algBw, r.m.busBw);
        out << line;
        if (r.m.wrong >= 0) out << r.m.wrong; else out << "N/A";
        out << '\n';
      }
      if (!out) {
        std::fprintf(stderr, "cannot write %s\n", o_.csvPath.c_str());
        return 1;
      }
    }
    return failed_ ? 1 : 0;
  }

 private:
  struct Row {
    Shape s;
    bool inPlace;
    Measurement m;
  };
  const Options& o_;
  std::string program_;
  int nranks_;
  std::string library_;
  std::vector<Row> rows_;
  int failed_ = 0;
  double busSum_ = 0;
};

}  // namespace compare
