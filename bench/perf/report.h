// Output of the perf benchmarks: nccl-tests' text table on stdout
// (README.md, "Output") and the same rows as CSV and JSON files.
//
// Role: only global rank 0 owns a Report; its thread calls it in program
// order (preamble, header, rows, footer, files). Rows are kept in memory and
// written to the files at the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "options.h"

namespace shoal::perf {

struct Measurement {
  double timeUs = 0;
  double algBw = 0;              // GB/s
  double busBw = 0;              // GB/s
  std::optional<int64_t> wrong;  // empty when not checked ("N/A")
};

class Report {
 public:
  Report(const Options& options, std::string program, std::string collective, int nranks);

  // "# nccl-tests version ..." through the "# Using devices" lines;
  // `memoryLine` ("# Memory: ...") says where the buffers are.
  void printPreamble(int ncclVersion, const std::string& memoryLine,
                     const std::string& deviceLines) const;
  void printTableHeader() const;

  // One table row: start, then out-of-place and in-place measurements, end.
  void beginRow(size_t bytes, size_t count, const char* type, const char* op, int root);
  void addMeasurement(bool inPlace, const Measurement& m);
  void endRow() const;

  // Mean busbw over every measurement printed so far.
  double averageBusBw() const;
  // The summary lines; returns false when the bandwidth is below
  // 0.9 x NCCL_TESTS_MIN_BW (when that is set).
  bool printFooter(int64_t outOfBoundsChecks) const;

  // Writes --csv and --json; returns false (after printing why) on failure.
  bool writeFiles(int ncclVersion) const;

 private:
  struct Row {
    size_t bytes;
    size_t count;
    std::string type;
    std::string op;
    int root;
    bool inPlace;
    Measurement m;
  };
  bool writeCsv(const std::string& path) const;
  bool writeJson(const std::string& path, int ncclVersion) const;

  const Options& options_;
  std::string program_;
  std::string collective_;
  int nranks_;
  Row current_{};
  std::vector<Row> rows_;
  double busBwSum_ = 0;
};

// A fixed-width number as nccl-tests prints it: as many decimals as fit in
// `width` (2, 1, 0), then scientific notation.
std::string formatFitted(double value, int width);

// This host's name up to the first dot.
std::string shortHostName();

// "#  Rank  0 Group  0 Pid  1234 on   hostname device -1 [host] <cpu>" for
// ranks [firstRank, firstRank + devices.size()) of this process, where
// devices[i] is the CUDA device of rank firstRank + i, or -1 for host memory
// ("device  0 [0000:07:00] <GPU name>" then, as nccl-tests prints it).
std::string describeLocalRanks(int firstRank, const std::vector<int>& devices);

}  // namespace shoal::perf
