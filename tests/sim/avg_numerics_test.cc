// ncclAvg through the public API, 3 ranks of one process (ncclCommInitAll),
// with inputs whose exact result tells NCCL's arithmetic from the
// alternatives, bit for bit.
//
// NCCL (its enqueue.cc; docs/nccl-compat.md, "Numerics"):
//   floating types: each rank's input is multiplied by the scalar 1/nranks in
//     the element type (ncclDevPreMulSum), then the products are summed in the
//     type. The scalar is float(1.0/n) converted to the type (double: 1.0/n).
//   integer types: the sum in the type, then one division by nranks,
//     truncating toward zero (ncclDevSumPostDiv).
// Every rank passes the same value, so every summation order gives the same
// bits: p + p is exact and (p + p) + p is one rounding.
//
// The expected values are computed here from that definition, with the
// CPU's IEEE float/double arithmetic and the formats' definitions
// (tests/support/number_formats.h), never with the library's reducer; each is
// also written out as a literal derived by hand.
#include <catch2/catch.hpp>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "support/number_formats.h"

using namespace shoal;
using shoal::testing::decodeValue;
using shoal::testing::encodeExact;
using shoal::testing::roundTo;

namespace {

constexpr int kRanks = 3;
constexpr size_t kCount = 67;  // whole vector registers and a tail

struct Comms {
  std::vector<ncclComm_t> comms = std::vector<ncclComm_t>(kRanks, nullptr);
  Comms() { REQUIRE(ncclCommInitAll(comms.data(), kRanks, nullptr) == ncclSuccess); }
  ~Comms() {
    for (ncclComm_t c : comms) (void)ncclCommDestroy(c);
  }
};

uint64_t bitsOf(const void* p, size_t size) {
  uint64_t b = 0;
  std::memcpy(&b, p, size);
  return b;
}

// Runs `kind` (AllReduce, ReduceScatter or Reduce to root 1) with ncclAvg,
// rank r's every input element being inputs[r], and checks every output
// element on every rank that gets one against `want` (one element of t).
void runAvg(Comms& w, ncclDataType_t nt, DataType t, const std::vector<double>& inputs, const void* want,
            const char* kind) {
  const size_t es = dataTypeSize(t);
  const bool scatter = std::strcmp(kind, "ReduceScatter") == 0;
  const size_t sendCount = scatter ? kCount * kRanks : kCount;
  std::vector<std::vector<uint8_t>> send(kRanks, std::vector<uint8_t>(sendCount * es)),
      recv(kRanks, std::vector<uint8_t>(kCount * es, 0xAB));
  for (int r = 0; r < kRanks; ++r)
    for (size_t i = 0; i < sendCount; ++i) encodeExact(t, inputs[r], send[r].data() + i * es);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < kRanks; ++r) {
    ncclResult_t rc;
    if (scatter)
      rc = ncclReduceScatter(send[r].data(), recv[r].data(), kCount, nt, ncclAvg, w.comms[r], nullptr);
    else if (std::strcmp(kind, "Reduce") == 0)
      rc = ncclReduce(send[r].data(), recv[r].data(), kCount, nt, ncclAvg, 1, w.comms[r], nullptr);
    else
      rc = ncclAllReduce(send[r].data(), recv[r].data(), kCount, nt, ncclAvg, w.comms[r], nullptr);
    REQUIRE(rc == ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  for (int r = 0; r < kRanks; ++r) {
    if (std::strcmp(kind, "Reduce") == 0 && r != 1) continue;
    for (size_t i = 0; i < kCount; ++i) {
      const uint8_t* got = recv[r].data() + i * es;
      INFO(kind << " " << dataTypeName(t) << " rank " << r << " element " << i << ": got "
                << decodeValue(t, got) << " (0x" << std::hex << bitsOf(got, es) << "), want "
                << decodeValue(t, want) << " (0x" << bitsOf(want, es) << ")");
      REQUIRE(std::memcmp(got, want, es) == 0);
    }
  }
}

const char* const kKinds[] = {"AllReduce", "ReduceScatter", "Reduce"};

}  // namespace

TEST_CASE("ncclAvg on floating types pre-multiplies by 1/n in the type - exact bits at 3 ranks", "[sim][avg]") {
  struct FloatCase {
    ncclDataType_t nt;
    DataType t;
    double x;         // every rank's input
    uint64_t want;    // by hand: p = x * s rounded, then (p + p) + p rounded
    double quotient;  // sum then divide: (x + x + x) / 3 rounded, which must differ
  };
  // s = 1/3 in the type: float 0x3EAAAAAB (11184811 * 2^-25), double
  // 0x3FD5555555555555, half 0x3555 (1365 * 2^-12), bf16 0x3EAB (171 * 2^-9),
  // e4m3 0x2B (0.34375), e5m2 0x35 (0.3125).
  const FloatCase cases[] = {
      // 7s = 78293677 * 2^-25 -> p = 9786710 * 2^-22; 3p = 14680065 * 2^-21, exact: 7 + 2^-21.
      {ncclFloat32, DataType::kFloat32, 7, 0x40E00001, 7},
      // s = 6004799503160661 * 2^-54; 7s -> p = 5254199565265578 * 2^-51;
      // 3p = 7881299347898367 * 2^-50, exact: 7 - 2^-50.
      {ncclFloat64, DataType::kFloat64, 7, 0x401BFFFFFFFFFFFF, 7},
      // 7s = 9555 * 2^-12 -> p = 1194 * 2^-9; 3p = 1791 * 2^-8, exact: 7 - 2^-8.
      {ncclFloat16, DataType::kFloat16, 7, 0x46FF, 7},
      // 7s = 1197 * 2^-9 -> p = 150 * 2^-6; 3p = 225 * 2^-5 = 7.03125, exact.
      {ncclBfloat16, DataType::kBfloat16, 7, 0x40E1, 7},
      // 7s = 2.40625 -> p = 2.5; 3p = 7.5, exact (0x4F). Sum then divide:
      // 14 + 7 = 21, a tie of 20/22, to the even 20; 20 / 3 -> 6.5.
      {ncclFloat8e4m3, DataType::kFloat8e4m3, 7, 0x4F, 6.5},
      // 5s = 1.5625 -> p = 1.5; 3p = 4.5, a tie of 4/5, to the even 4 (0x44).
      // Sum then divide: 10 + 5 = 15, a tie of 14/16, to the even 16; 16 / 3 -> 5.
      {ncclFloat8e5m2, DataType::kFloat8e5m2, 5, 0x44, 5},
  };
  Comms w;
  for (const FloatCase& c : cases) {
    INFO(dataTypeName(c.t));
    // The definition, computed here (NCCL: float(1.0/n), then the type).
    const double s = c.t == DataType::kFloat64 ? 1.0 / kRanks : roundTo(c.t, static_cast<float>(1.0 / kRanks));
    const double p = roundTo(c.t, c.x * s);
    const double premul = roundTo(c.t, roundTo(c.t, p + p) + p);
    uint8_t want[8] = {};
    encodeExact(c.t, premul, want);
    REQUIRE(bitsOf(want, dataTypeSize(c.t)) == c.want);
    // The inputs tell the two apart: the sum divided once is another value.
    const double x3 = roundTo(c.t, roundTo(c.t, c.x + c.x) + c.x);
    REQUIRE(roundTo(c.t, x3 / kRanks) == c.quotient);
    REQUIRE(premul != c.quotient);
    for (const char* kind : kKinds) runAvg(w, c.nt, c.t, {c.x, c.x, c.x}, want, kind);
  }
}

TEST_CASE("ncclAvg on integers sums in the type then divides once - truncating toward zero", "[sim][avg]") {
  struct IntCase {
    ncclDataType_t nt;
    DataType t;
    std::vector<double> inputs;
    double want;
    const char* why;
  };
  const IntCase cases[] = {
      {ncclInt32, DataType::kInt32, {7, 8, 8}, 7, "23 / 3 = 7.67 truncates to 7 (not 8)"},
      {ncclInt32, DataType::kInt32, {-7, -8, -8}, -7, "-23 / 3 truncates toward zero: -7 (floor: -8)"},
      {ncclInt8, DataType::kInt8, {-1, -1, 0}, 0, "-2 / 3 truncates to 0"},
      {ncclInt64, DataType::kInt64, {7, 7, 8}, 7, "22 / 3 = 7.33: 7"},
      {ncclUint32, DataType::kUint32, {1, 1, 0}, 0, "2 / 3: 0 (a pre-multiply by 1/3 in the type would be 0 too)"},
      {ncclUint8, DataType::kUint8, {100, 100, 100}, 14,
       "the sum wraps in the type first: 300 - 256 = 44, 44 / 3 = 14 (not 100)"},
      {ncclUint64, DataType::kUint64, {5, 5, 6}, 5, "16 / 3: 5"},
  };
  Comms w;
  for (const IntCase& c : cases) {
    INFO(dataTypeName(c.t) << ": " << c.why);
    uint8_t want[8] = {};
    encodeExact(c.t, c.want, want);
    for (const char* kind : kKinds) runAvg(w, c.nt, c.t, c.inputs, want, kind);
  }
}
