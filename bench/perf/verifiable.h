// Verifiable data for the perf benchmarks: inputs whose collective results are
// exactly known, whatever order the library reduces in.
//
// Role: each rank writes its input with DataPattern::writeInput, computes the
// elements it must receive with writeExpected, and counts the mismatches
// after the collective (the "#wrong" column). Pure host code, no NCCL calls;
// a DataPattern is immutable and may be shared by threads.
//
// Why results are exact (nccl-tests' rule; README.md, 'What "#wrong" means'):
// inputs are small integers, chosen per type and operator so that every
// partial result of any reduction order is an integer the type represents
// exactly (e.g. at most 16 for fp8 e4m3 sums, 2048 for half). Then sum, prod,
// max, min and premulsum are bit-exact. Floating avg is premultiply-by-1/n
// then sum; only two ranks contribute non-zero values so that only the
// roundings of NCCL's recipe remain, and 2 ulps of difference are accepted.
// Copy-only collectives (op "none") use patterns with many distinct values.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace shoal::perf {

// ---- Data types -------------------------------------------------------------

struct TypeInfo {
  ncclDataType_t type;
  const char* name;   // nccl-tests' name: int8 ... f8e5m2
  size_t size;        // bytes per element
  bool floating;
  bool isSigned;
  int minVersion;     // first NCCL_VERSION_CODE with the type
};

// Every type, in nccl-tests' order ("-d all").
std::span<const TypeInfo> allTypes();
// nullptr for a name that is not a type.
const TypeInfo* findType(const char* name);
const TypeInfo& typeInfo(ncclDataType_t type);

// ---- Operators --------------------------------------------------------------

enum class Op { kNone, kSum, kProd, kMax, kMin, kAvg, kMulSum };

struct OpInfo {
  Op op;
  const char* name;   // "sum" ... "mulsum"; "none" for copy-only collectives
  int minVersion;     // first NCCL_VERSION_CODE with the operator
};

// The reduction operators, in nccl-tests' order ("-o all").
std::span<const OpInfo> allReductionOps();
const OpInfo* findOp(const char* name);
const OpInfo& opInfo(Op op);
// The built-in ncclRedOp_t of op (kMulSum and kNone have none: ncclNumOps).
ncclRedOp_t builtinRedOp(Op op);

// ---- Expected data ----------------------------------------------------------

// Where one received element comes from: element `index` of rank `rank`'s
// input, or (rank == kAllRanks) the reduction over all ranks of element
// `index` of their inputs.
struct ElementSource {
  static constexpr int kAllRanks = -1;
  int rank;
  size_t index;

  static constexpr ElementSource reduced(size_t index) { return {kAllRanks, index}; }
  static constexpr ElementSource fromRank(int rank, size_t index) { return {rank, index}; }
};

class DataPattern {
 public:
  // seed varies the data between checks so that stale results cannot pass.
  DataPattern(ncclDataType_t type, Op op, int nranks, uint64_t seed);

  // dst[i] = input element i of `rank`, for i < count.
  void writeInput(void* dst, int rank, size_t count) const;

  // dst[k] = the expected element k, for k < count, where source(k) returns
  // the ElementSource of element k.
  template <class SourceFn>
  void writeExpected(void* dst, size_t count, SourceFn&& source) const {
    for (size_t k = 0; k < count; ++k) storeBits(dst, k, expectedBits(source(k)));
  }

  // Number of elements of actual that differ from expected (bit-exact, or
  // more than 2 ulps apart for floating avg).
  size_t countMismatches(const void* actual, const void* expected, size_t count) const;

 private:
  int64_t inputValue(int rank, size_t index) const;
  uint64_t encodeValue(int64_t value) const;
  uint64_t expectedBits(ElementSource source) const;
  uint64_t reducedBits(size_t index) const;
  void storeBits(void* dst, size_t index, uint64_t bits) const;

  const TypeInfo& type_;
  Op op_;
  int nranks_;
  uint64_t seed_;
  int contributors_;   // ranks r < contributors_ have non-trivial inputs
  int64_t maxValue_;   // bound of the generated magnitudes
};

// The ncclRedOpCreatePreMulSum scalar of `rank` for Op::kMulSum (1 on even
// ranks, 2 on odd ones, as nccl-tests) as one element of type, in the low bytes.
uint64_t preMulScalarBits(ncclDataType_t type, int rank);

// ---- Element encoding (exposed for tests of this module) --------------------

// value as one element of type: integers wrap to the width, floating types
// round to nearest even (fp8 e4m3 overflows to NaN, the others to inf).
uint64_t encodeElement(ncclDataType_t type, double value);
// One element of type back to double (exact for every type).
double decodeElement(ncclDataType_t type, uint64_t bits);
// Distance in units in the last place between two elements of a floating type.
uint64_t ulpDistance(ncclDataType_t type, uint64_t a, uint64_t b);

}  // namespace shoal::perf
