// Output of the perf benchmarks; see report.h.
#include "report.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "device.h"

namespace shoal::perf {
namespace {

// nccl-tests' version this output imitates, marked as Shoal's.
constexpr const char* kNcclTestsVersion = "2.19.6-shoal";

std::string cpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  }
  return "host CPU";
}

std::string jsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Shortest text that reads back as the same double (finite values only).
std::string number(double value) {
  char text[32];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(text, sizeof text, "%.*g", precision, value);
    double back = 0;
    if (std::sscanf(text, "%lf", &back) == 1 && back == value) break;
  }
  return text;
}

}  // namespace

std::string shortHostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  std::string host(name);
  return host.substr(0, host.find('.'));  // as nccl-tests: up to the first dot
}

std::string formatFitted(double value, int width) {
  int integerDigits = 0;
  for (double power = 1; value >= power && integerDigits < 40; power *= 10) ++integerDigits;
  char text[64];
  if (integerDigits < width - 2) {
    std::snprintf(text, sizeof text, "%*.2f", width, value);
  } else if (integerDigits < width - 1) {
    std::snprintf(text, sizeof text, "%*.1f", width, value);
  } else if (integerDigits < width + 1) {
    std::snprintf(text, sizeof text, "%*.0f", width, value);
  } else if (width >= 7) {
    std::snprintf(text, sizeof text, "%*.1e", width, value);
  } else {
    std::snprintf(text, sizeof text, "%*.0e", width, value);
  }
  return text;
}

std::string describeLocalRanks(int firstRank, const std::vector<int>& devices) {
  const std::string host = shortHostName();
  std::string cpu;
  std::string lines;
  for (size_t i = 0; i < devices.size(); ++i) {
    std::string where;
    if (devices[i] < 0) {
      if (cpu.empty()) cpu = cpuModel();
      where = "[host] " + cpu;
    } else {
      where = describeDevice(devices[i]);
    }
    char line[512];
    std::snprintf(line, sizeof line, "#  Rank %2d Group %2d Pid %6d on %10s device %2d %s\n",
                  firstRank + static_cast<int>(i), 0, static_cast<int>(getpid()), host.c_str(),
                  devices[i], where.c_str());
    lines += line;
  }
  return lines;
}

Report::Report(const Options& options, std::string program, std::string collective, int nranks)
    : options_(options),
      program_(std::move(program)),
      collective_(std::move(collective)),
      nranks_(nranks) {}

void Report::printPreamble(int ncclVersion, const std::string& memoryLine,
                           const std::string& deviceLines) const {
  const Options& o = options_;
  std::printf("# nccl-tests version %s nccl-headers=%d nccl-library=%d\n", kNcclTestsVersion,
              NCCL_VERSION_CODE, ncclVersion);
  std::printf("# Collective test starting: %s\n", program_.c_str());
  std::printf(
      "# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
      "agg iters: %d validation: %d graph: %d unalign: %d\n",
      o.threads, 1, o.minBytes, o.maxBytes, o.stepFactor > 1 ? o.stepFactor : o.stepBytes,
      o.stepFactor > 1 ? "factor" : "bytes", o.warmupIters, o.iters, o.aggIters, o.check, o.graphLaunches,
      o.unalign);
  if (o.blocking == 1) {
    std::printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
  } else if (o.blocking == 2) {
    std::printf("# Blocking Enabled: wait for completion after each collective (no barrier) \n");
  } else if (o.blocking == 3) {
    std::printf("# Blocking Enabled: barrier after each iteration, excluded from the time \n");
  }
  if (o.parallelInit) {
    std::printf("# Parallel Init Enabled: threads call into NcclInitRank concurrently \n");
  }
  if (!o.jsonPath.empty()) std::printf("# Writing JSON output to %s\n", o.jsonPath.c_str());
  if (!o.csvPath.empty()) std::printf("# Writing CSV output to %s\n", o.csvPath.c_str());
  std::printf("%s\n#\n# Using devices\n%s", memoryLine.c_str(), deviceLines.c_str());
}

void Report::printTableHeader() const {
  const char* time = options_.reportCpuTime ? "cputime" : "time";
  std::printf("#\n");
  std::printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
              "          \n",
              "", "", "", "", "");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n", "size",
              "count", "type", "redop", "root", time, "algbw", "busbw", "#wrong", time, "algbw",
              "busbw", "#wrong");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n", "(B)",
              "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
              "");
}

void Report::beginRow(size_t bytes, size_t count, const char* type, const char* op, int root) {
  current_ = Row{bytes, count, type, op, root, false, {}};
  std::printf("%12zu  %12zu  %8s  %6s  %6i", bytes, count, type, op, root);
}

void Report::addMeasurement(bool inPlace, const Measurement& m) {
  const std::string time = formatFitted(m.timeUs, 7);
  const std::string algBw = formatFitted(m.algBw, 6);
  const std::string busBw = formatFitted(m.busBw, 6);
  if (m.wrong) {
    std::printf("  %7s  %6s  %6s  %6g", time.c_str(), algBw.c_str(), busBw.c_str(),
                static_cast<double>(*m.wrong));
  } else {
    std::printf("  %7s  %6s  %6s    N/A", time.c_str(), algBw.c_str(), busBw.c_str());
  }
  Row row = current_;
  row.inPlace = inPlace;
  row.m = m;
  rows_.push_back(row);
  busBwSum_ += m.busBw;
}

void Report::endRow() const { std::printf("\n"); }

double Report::averageBusBw() const {
  return rows_.empty() ? 0.0 : busBwSum_ / static_cast<double>(rows_.size());
}

bool Report::printFooter(int64_t outOfBoundsChecks) const {
  const double average = averageBusBw();
  const char* minBwText = std::getenv("NCCL_TESTS_MIN_BW");
  bool bandwidthOk = true;
  const char* verdict = "";
  if (minBwText != nullptr) {
    bandwidthOk = average >= 0.9 * std::strtod(minBwText, nullptr);
    verdict = bandwidthOk ? "OK" : "FAILED";
  }
  std::printf("# %-20s : %" PRId64 " %s\n", "Out of bounds values", outOfBoundsChecks,
              outOfBoundsChecks ? "FAILED" : "OK");
  std::printf("# %-20s : %g %s\n", "Avg bus bandwidth", average, verdict);
  std::printf("#\n");
  std::printf("# Collective test concluded: %s\n", program_.c_str());
  return bandwidthOk;
}

bool Report::writeFiles(int ncclVersion) const {
  bool ok = true;
  if (!options_.csvPath.empty()) ok &= writeCsv(options_.csvPath);
  if (!options_.jsonPath.empty()) ok &= writeJson(options_.jsonPath, ncclVersion);
  return ok;
}

bool Report::writeCsv(const std::string& path) const {
  std::ofstream out(path);
  out << "collective,nranks,bytes,count,type,op,root,in_place,time_us,algbw,busbw,wrong\n";
  for (const Row& row : rows_) {
    out << collective_ << ',' << nranks_ << ',' << row.bytes << ',' << row.count << ','
        << row.type << ',' << row.op << ',' << row.root << ',' << (row.inPlace ? 1 : 0) << ','
        << number(row.m.timeUs) << ',' << number(row.m.algBw) << ',' << number(row.m.busBw)
        << ',' << (row.m.wrong ? std::to_string(*row.m.wrong) : std::string("N/A")) << '\n';
  }
  out.close();
  if (!out) std::fprintf(stderr, "# cannot write CSV output to %s\n", path.c_str());
  return static_cast<bool>(out);
}

bool Report::writeJson(const std::string& path, int ncclVersion) const {
  std::ofstream out(path);
  out << "{\n  \"benchmark\": " << jsonString(program_) << ",\n  \"collective\": "
      << jsonString(collective_) << ",\n  \"nranks\": " << nranks_
      << ",\n  \"nccl_version\": " << ncclVersion << ",\n  \"results\": [";
  const char* separator = "\n";
  for (const Row& row : rows_) {
    out << separator << "    {\"collective\": " << jsonString(collective_)
        << ", \"nranks\": " << nranks_ << ", \"bytes\": " << row.bytes
        << ", \"count\": " << row.count << ", \"type\": " << jsonString(row.type)
        << ", \"op\": " << jsonString(row.op) << ", \"root\": " << row.root
        << ", \"in_place\": " << (row.inPlace ? "true" : "false")
        << ", \"time_us\": " << number(row.m.timeUs) << ", \"algbw\": " << number(row.m.algBw)
        << ", \"busbw\": " << number(row.m.busBw)
        << ", \"wrong\": " << (row.m.wrong ? std::to_string(*row.m.wrong) : std::string("null"))
        << "}";
    separator = ",\n";
  }
  out << "\n  ],\n  \"average_busbw\": " << number(averageBusBw()) << "\n}\n";
  out.close();
  if (!out) std::fprintf(stderr, "# cannot write JSON output to %s\n", path.c_str());
  return static_cast<bool>(out);
}

}  // namespace shoal::perf
