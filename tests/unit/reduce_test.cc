// Tests of the reducer (src/reduce/): number-format conversions, and every
// data type x operator on every instruction-set path against a reference
// written here, element by element, with edge values, odd counts, misaligned
// pointers and in-place operands.
//
// Build this file with -ffp-contract=off (tests.cmake): the reference below
// must not fuse a*s+b either.
#include <catch2/catch.hpp>
#include <algorithm>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/types.h"
#include "reduce/numerics.h"
#include "reduce/reduce.h"
#include "reduce/reduce_internal.h"
#include "support/number_formats.h"

namespace shoal::reduce {
namespace {

const DataType kAllTypes[] = {
    DataType::kInt8,    DataType::kUint8,    DataType::kInt32,      DataType::kUint32,
    DataType::kInt64,   DataType::kUint64,   DataType::kFloat16,    DataType::kFloat32,
    DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin,
                            ReduceOp::kPreMulSum};
const DataType kSmallTypes[] = {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat8e4m3,
                                DataType::kFloat8e5m2};

// The paths this CPU can run; restores the automatic choice when destroyed.
struct IsaList {
  std::vector<std::string> names;
  IsaList() {
    for (const char* n : {"scalar", "avx2", "avx512"}) {
      if (cpuSupportsIsa(n)) names.push_back(n);
    }
  }
  ~IsaList() { setIsaForTesting(nullptr); }
};

// ---- Small formats described independently of numerics.h ----------------------
//
// tests/support/number_formats.h writes them from their definitions, with
// literal codes, never the implementation's constants (fp8 overflow: NCCL's
// __NV_SATFINITE; NaN: the canonical positive NaN); its sources are there.
using testing::Format;
using testing::formatOf;
using testing::isNanCode;
using testing::refRound;
using testing::refValue;

uint32_t toCode(DataType t, float f) {
  switch (t) {
    case DataType::kFloat16: return floatToHalf(f);
    case DataType::kBfloat16: return floatToBf16(f);
    case DataType::kFloat8e4m3: return floatToE4m3(f);
    case DataType::kFloat8e5m2: return floatToE5m2(f);
    default: return 0;
  }
}
float fromCode(DataType t, uint32_t c) {
  switch (t) {
    case DataType::kFloat16: return halfToFloat(uint16_t(c));
    case DataType::kBfloat16: return bf16ToFloat(uint16_t(c));
    case DataType::kFloat8e4m3: return e4m3ToFloat(uint8_t(c));
    case DataType::kFloat8e5m2: return e5m2ToFloat(uint8_t(c));
    default: return 0;
  }
}

// ---- Conversion tests ------------------------------------------------------------

TEST_CASE("small formats: every code converts to its exact value and back", "[reduce][convert]") {
  for (DataType t : kSmallTypes) {
    const Format f = formatOf(t);
    INFO(dataTypeName(t));
    for (uint32_t c = 0; c < (1u << f.bits); ++c) {
      const double want = refValue(t, c);
      const float got = fromCode(t, c);
      if (std::isnan(want)) {
        REQUIRE(std::isnan(got));
        REQUIRE(toCode(t, got) == f.nanCode);
        double d = toDouble(t, &c);
        REQUIRE(std::isnan(d));
        continue;
      }
      if (double(got) != want || std::signbit(got) != std::signbit(want)) {
        FAIL("code " << c << " gave " << got << " want " << want);
      }
      // With NCCL's saturating fp8 rounding an infinite code (e5m2) converts
      // back to the largest finite value of its sign.
      const bool saturatedInf = std::isinf(want) && f.bits == 8;
      if (!saturatedInf && toCode(t, got) != c)
        FAIL("code " << c << " roundtrip gave " << toCode(t, got));
      // toDouble / fromDouble agree.
      REQUIRE(toDouble(t, &c) == want);
      if (saturatedInf) continue;
      uint32_t back = 0;
      fromDouble(t, want, &back);
      REQUIRE(back == c);
    }
  }
}

TEST_CASE("half and bf16 widening match the hardware / bit layout", "[reduce][convert]") {
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint32_t absC = c & 0x7FFF;
    if (absC <= 0x7F80) REQUIRE(floatBits(bf16ToFloat(uint16_t(c))) == c << 16);
  }
#if defined(__x86_64__)
  if (cpuSupportsIsa("avx2")) {  // implies F16C
    struct Hw {
      __attribute__((target("f16c"))) static float widen(uint16_t h) { return _cvtsh_ss(h); }
    };
    for (uint32_t c = 0; c < 65536; ++c) {
      if ((c & 0x7FFF) > 0x7C00) continue;  // NaN payloads are not kept
      REQUIRE(floatBits(halfToFloat(uint16_t(c))) == floatBits(Hw::widen(uint16_t(c))));
    }
  }
#endif
}

// For every pair of neighbouring codes (lo, hi), including 0 and the smallest
// subnormal and the largest finite value and the overflow, the floats at and
// around lo, hi and their midpoint round as round-to-nearest-even says.
std::vector<float> tieProbes(DataType t, std::vector<uint32_t>* want) {
  const Format f = formatOf(t);
  std::vector<float> probes;
  auto add = [&](float x, uint32_t code) {
    probes.push_back(x);
    want->push_back(code);
    probes.push_back(-x);
    want->push_back(isNanCode(f, code) ? code : code | (1u << (f.bits - 1)));
  };
  for (uint32_t lo = 0; lo <= f.maxCode; ++lo) {
    const double vlo = refValue(t, lo);
    const bool top = lo == f.maxCode;
    const double vhi = top ? vlo + (vlo - refValue(t, lo - 1)) : refValue(t, lo + 1);
    const uint32_t hiCode = top ? f.overflowCode : lo + 1;
    const float mid = float((vlo + vhi) / 2);
    REQUIRE(double(mid) == (vlo + vhi) / 2);  // midpoints are floats
    const uint32_t even = (lo & 1) ? hiCode : lo;
    add(float(vlo), lo);
    add(std::nextafter(float(vlo), INFINITY), lo);
    add(std::nextafter(mid, 0.0f), lo);
    add(mid, even);
    add(std::nextafter(mid, INFINITY), hiCode);
    if (!top) add(std::nextafter(float(vhi), 0.0f), hiCode);
  }
  add(INFINITY, f.overflowCode);  // inf, or NaN for e4m3, or max finite if saturating
  add(std::numeric_limits<float>::max(), f.overflowCode);
  add(std::numeric_limits<float>::denorm_min(), 0);
  add(std::numeric_limits<float>::min(), t == DataType::kBfloat16 ? 0x0080u : 0u);
  return probes;
}

TEST_CASE("float to small format: ties / neighbours / subnormals / overflow", "[reduce][convert]") {
  for (DataType t : kSmallTypes) {
    INFO(dataTypeName(t));
    std::vector<uint32_t> want;
    const std::vector<float> probes = tieProbes(t, &want);
    for (size_t i = 0; i < probes.size(); ++i) {
      const uint32_t got = toCode(t, probes[i]);
      if (got != want[i]) {
        FAIL("float " << probes[i] << " (0x" << std::hex << floatBits(probes[i]) << ") gave 0x"
                      << got << " want 0x" << want[i]);
      }
    }
  }
}

TEST_CASE("float to small format: random floats against the search reference",
          "[reduce][convert]") {
  std::mt19937 rng(1234);
  for (DataType t : kSmallTypes) {
    INFO(dataTypeName(t));
    const Format f = formatOf(t);
    for (int i = 0; i < 200000; ++i) {
      uint32_t bits = rng();
      if (i % 2 == 0) {  // exponents near the format's range
        const int span = t == DataType::kBfloat16 ? 254 : 50;
        const uint32_t e = uint32_t(127 - span / 2 + int(rng() % span)) & 0xFF;
        bits = (bits & 0x807FFFFFu) | (e << 23);
      }
      const float x = bitsFloat(bits);
      const uint32_t got = toCode(t, x);
      const uint32_t want = refRound(f, double(x));
      if (got != want) FAIL("0x" << std::hex << bits << " gave 0x" << got << " want 0x" << want);
    }
  }
}

// Hand-written codes for chosen floats, each derived from the format's
// definition (sources in tests/support/number_formats.h; fp8 overflow is
// NCCL's __NV_SATFINITE, not the format's): exact values, ties to even, the smallest subnormal and half of it,
// the largest subnormal, the smallest normal, just below and at the midpoint
// to overflow, beyond it, infinities, NaN and negative zero.
struct HandCode {
  DataType type;
  float in;
  uint32_t want;  // kAnyNan: any NaN code of the format
  const char* why;
};
constexpr uint32_t kAnyNan = ~0u;

bool isNanByDefinition(DataType t, uint32_t c) {
  switch (t) {
    case DataType::kFloat16: return (c & 0x7C00) == 0x7C00 && (c & 0x03FF) != 0;
    case DataType::kBfloat16: return (c & 0x7F80) == 0x7F80 && (c & 0x007F) != 0;
    case DataType::kFloat8e4m3: return (c & 0x7F) == 0x7F;
    case DataType::kFloat8e5m2: return (c & 0x7C) == 0x7C && (c & 0x03) != 0;
    default: return false;
  }
}

std::vector<HandCode> handCodes() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float fmax = std::numeric_limits<float>::max();
  const float third = 0x1.555556p-2f;  // float(1/3), 0x3EAAAAAB
  const DataType h = DataType::kFloat16, b = DataType::kBfloat16, e4 = DataType::kFloat8e4m3,
                 e5 = DataType::kFloat8e5m2;
  return {
      // binary16: 1 sign, 5 exponent (bias 15), 10 fraction bits.
      {h, 1.0f, 0x3C00, "1"},
      {h, -0.0f, 0x8000, "negative zero"},
      {h, 0x1.002p0f, 0x3C00, "1+2^-11: tie of 0x3C00/0x3C01, to even"},
      {h, 0x1.006p0f, 0x3C02, "1+3*2^-11: tie of 0x3C01/0x3C02, to even"},
      {h, 0x1.002004p0f, 0x3C01, "1+2^-11+2^-22: above the tie"},
      {h, 2049.0f, 0x6800, "2049: tie of 2048/2050, to even"},
      {h, third, 0x3555, "1/3: 1.0101010101b x 2^-2, rest below half"},
      {h, 0x1p-24f, 0x0001, "smallest subnormal 2^-24"},
      {h, 0x1p-25f, 0x0000, "2^-25: tie of 0/0x0001, to even"},
      {h, 0x1.000002p-25f, 0x0001, "just above 2^-25"},
      {h, -0x1p-25f, 0x8000, "-2^-25: negative zero"},
      {h, 0x1.8p-24f, 0x0002, "3*2^-25: tie of 0x0001/0x0002, to even"},
      {h, 0x1.ff8p-15f, 0x03FF, "largest subnormal 1023*2^-24"},
      {h, 0x1p-14f, 0x0400, "smallest normal 2^-14"},
      {h, 65504.0f, 0x7BFF, "max finite 65504"},
      {h, 0x1.ffdffep15f, 0x7BFF, "just below 65520, halfway to 2^16"},
      {h, 65520.0f, 0x7C00, "65520: tie of 0x7BFF/inf, to the even inf"},
      {h, 65536.0f, 0x7C00, "2^16 overflows to inf"},
      {h, inf, 0x7C00, "inf"},
      {h, -inf, 0xFC00, "-inf"},
      {h, nan, kAnyNan, "NaN"},
      // bfloat16: the top 16 bits of binary32, rounded to nearest even.
      {b, 1.0f, 0x3F80, "1"},
      {b, -0.0f, 0x8000, "negative zero"},
      {b, 0x1.01p0f, 0x3F80, "1+2^-8: tie of 0x3F80/0x3F81, to even"},
      {b, 0x1.03p0f, 0x3F82, "1+3*2^-8: tie of 0x3F81/0x3F82, to even"},
      {b, 0x1.010002p0f, 0x3F81, "just above 1+2^-8"},
      {b, third, 0x3EAB, "1/3: 0x3EAAAAAB, low half 0xAAAB above 0x8000"},
      {b, 0x1p-133f, 0x0001, "smallest subnormal 2^-133"},
      {b, 0x1p-134f, 0x0000, "2^-134: tie of 0/0x0001, to even"},
      {b, 0x1.8p-133f, 0x0002, "3*2^-134: tie of 0x0001/0x0002, to even"},
      {b, 0x1p-149f, 0x0000, "float's smallest subnormal"},
      {b, 0x1p-126f, 0x0080, "smallest normal 2^-126"},
      {b, 0x1.fep127f, 0x7F7F, "max finite (2-2^-7)*2^127"},
      {b, 0x1.fefffep127f, 0x7F7F, "just below halfway to 2^128"},
      {b, 0x1.ffp127f, 0x7F80, "halfway to 2^128: tie of 0x7F7F/inf, to the even inf"},
      {b, fmax, 0x7F80, "FLT_MAX overflows to inf"},
      {b, inf, 0x7F80, "inf"},
      {b, -inf, 0xFF80, "-inf"},
      {b, nan, kAnyNan, "NaN"},
      {b, std::bit_cast<float>(0x7F800001u), kAnyNan, "NaN with only a low payload bit: not inf"},
      // OCP E4M3: bias 7, 3 fraction bits, no infinities, max 448 = 0x7E.
      {e4, 1.0f, 0x38, "1"},
      {e4, -0.0f, 0x80, "negative zero"},
      {e4, 0x1.1p0f, 0x38, "1+2^-4: tie of 0x38/0x39, to even"},
      {e4, 0x1.3p0f, 0x3A, "1+3*2^-4: tie of 0x39/0x3A, to even"},
      {e4, 0x1.100002p0f, 0x39, "just above 1+2^-4"},
      {e4, third, 0x2B, "1/3: 1.011b x 2^-2 = 0.34375 is nearest"},
      {e4, 0x1p-9f, 0x01, "smallest subnormal 2^-9"},
      {e4, 0x1p-10f, 0x00, "2^-10: tie of 0/0x01, to even"},
      {e4, 0x1.000002p-10f, 0x01, "just above 2^-10"},
      {e4, -0x1p-10f, 0x80, "-2^-10: negative zero"},
      {e4, 0x1.8p-9f, 0x02, "3*2^-10: tie of 0x01/0x02, to even"},
      {e4, 0x1.cp-7f, 0x07, "largest subnormal 7*2^-9"},
      {e4, 0x1.ep-7f, 0x08, "7.5*2^-9: tie of 0x07/0x08, to even"},
      {e4, 0x1p-6f, 0x08, "smallest normal 2^-6"},
      {e4, 0x1.affffep8f, 0x7D, "just below 432, halfway from 416 to 448"},
      {e4, 432.0f, 0x7E, "432: tie of 0x7D/0x7E, to even"},
      {e4, 0x1.bffffep8f, 0x7E, "just below max finite"},
      {e4, 448.0f, 0x7E, "max finite 448"},
      {e4, 464.0f, 0x7E, "464, halfway to 480: tie, to the even 448"},
      {e4, 480.0f, 0x7E, "480: beyond, SATFINITE (NaN without it)"},
      {e4, -1000.0f, 0xFE, "-1000: SATFINITE"},
      {e4, fmax, 0x7E, "FLT_MAX: SATFINITE"},
      {e4, inf, 0x7E, "inf: SATFINITE"},
      {e4, -inf, 0xFE, "-inf: SATFINITE"},
      {e4, nan, kAnyNan, "NaN"},
      // OCP E5M2: bias 15, 2 fraction bits, inf 0x7C, max 57344 = 0x7B.
      {e5, 1.0f, 0x3C, "1"},
      {e5, -0.0f, 0x80, "negative zero"},
      {e5, 0x1.2p0f, 0x3C, "1+2^-3: tie of 0x3C/0x3D, to even"},
      {e5, 0x1.6p0f, 0x3E, "1+3*2^-3: tie of 0x3D/0x3E, to even"},
      {e5, 0x1.200002p0f, 0x3D, "just above 1+2^-3"},
      {e5, third, 0x35, "1/3: 1.01b x 2^-2 = 0.3125 is nearest"},
      {e5, 0x1p-16f, 0x01, "smallest subnormal 2^-16"},
      {e5, 0x1p-17f, 0x00, "2^-17: tie of 0/0x01, to even"},
      {e5, 0x1.000002p-17f, 0x01, "just above 2^-17"},
      {e5, -0x1p-17f, 0x80, "-2^-17: negative zero"},
      {e5, 0x1.8p-16f, 0x02, "3*2^-17: tie of 0x01/0x02, to even"},
      {e5, 0x1.8p-15f, 0x03, "largest subnormal 3*2^-16"},
      {e5, 0x1.cp-15f, 0x04, "3.5*2^-16: tie of 0x03/0x04, to even"},
      {e5, 0x1p-14f, 0x04, "smallest normal 2^-14"},
      {e5, 57344.0f, 0x7B, "max finite 57344"},
      {e5, 0x1.dffffep15f, 0x7B, "just below 61440, halfway to 2^16"},
      {e5, 61440.0f, 0x7B, "61440: the tie would give inf; SATFINITE"},
      {e5, 65536.0f, 0x7B, "2^16: SATFINITE (inf without it)"},
      {e5, inf, 0x7B, "inf: SATFINITE"},
      {e5, -inf, 0xFB, "-inf: SATFINITE"},
      {e5, nan, kAnyNan, "NaN"},
  };
}

TEST_CASE("float to small format: hand-written codes from the format definitions",
          "[reduce][convert][isa]") {
  auto check = [](const HandCode& c, uint32_t got, const char* how) {
    INFO(dataTypeName(c.type) << " " << c.why << " via " << how << ": got 0x" << std::hex << got);
    if (c.want == kAnyNan) {
      CHECK(isNanByDefinition(c.type, got));
      CHECK(got == (c.type == DataType::kFloat16 || c.type == DataType::kBfloat16 ? 0x7FFFu : 0x7Fu));
    } else {
      CHECK(got == c.want);
    }
  };
  IsaList isas;
  for (const HandCode& c : handCodes()) {
    check(c, toCode(c.type, c.in), "the scalar conversion");
    uint32_t viaDouble = 0;
    fromDouble(c.type, double(c.in), &viaDouble);
    check(c, viaDouble, "fromDouble");
    // The vector paths' own conversions, 33 copies to fill whole registers
    // and a tail (fp8 ones round through half and are only meant for results
    // of one operation: checked through combine).
    if (dataTypeSize(c.type) != 2) continue;
    const std::vector<float> in(33, c.in);
    std::vector<uint16_t> out(in.size());
    for (const std::string& isa : isas.names) {
      REQUIRE(setIsaForTesting(isa.c_str()));
      fromFloatForTesting(c.type, out.data(), in.data(), in.size());
      for (uint16_t got : out) check(c, got, isa.c_str());
    }
  }
}

#if defined(__x86_64__)
TEST_CASE("float to half matches vcvtps2ph", "[reduce][convert]") {
  if (!cpuSupportsIsa("avx2")) {  // implies F16C
    // Not compared on this CPU: reported (CHECK_NOFAIL), not passed silently.
    CHECK_NOFAIL(cpuSupportsIsa("avx2"));
    return;
  }
  struct Hw {
    __attribute__((target("f16c"))) static uint16_t narrow(float f) { return _cvtss_sh(f, 0); }
  };
  // All sign/exponent/top-10-mantissa combinations with the rounded-off bits
  // at and around every tie.
  const uint32_t lows[] = {0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x0ABC, 0x1ABC};
  for (uint32_t top = 0; top < (1u << 19); ++top) {
    for (uint32_t low : lows) {
      const uint32_t bits = (top << 13) | low;
      if ((bits & 0x7FFFFFFF) > 0x7F800000) continue;  // NaN: canonical here, payload there
      const float x = bitsFloat(bits);
      if (floatToHalf(x) != Hw::narrow(x)) {
        FAIL("0x" << std::hex << bits << " gave 0x" << floatToHalf(x) << " hw 0x"
                  << Hw::narrow(x));
      }
    }
  }
}
#endif

// Vector conversions (each path) equal the scalar ones on probes and random bits.
void checkFromFloatPaths(const std::vector<float>& in) {
  IsaList isas;
  // fp8 is not here: its vector paths round through half, which equals the
  // direct rounding only for results of one operation on fp8 operands (tested
  // exhaustively in "all pairs of fp8 codes").
  for (DataType t : {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32}) {
    const size_t es = dataTypeSize(t);
    std::vector<unsigned char> want(in.size() * es), got(in.size() * es);
    REQUIRE(setIsaForTesting("scalar"));
    fromFloatForTesting(t, want.data(), in.data(), in.size());
    for (const std::string& isa : isas.names) {
      INFO(dataTypeName(t) << " on " << isa);
      REQUIRE(setIsaForTesting(isa.c_str()));
      std::fill(got.begin(), got.end(), 0xCD);
      fromFloatForTesting(t, got.data(), in.data(), in.size());
      for (size_t i = 0; i < in.size(); ++i) {
        if (std::memcmp(&got[i * es], &want[i * es], es) != 0) {
          uint64_t g = 0, w = 0;
          std::memcpy(&g, &got[i * es], es);
          std::memcpy(&w, &want[i * es], es);
          FAIL("float 0x" << std::hex << floatBits(in[i]) << " gave 0x" << g << " want 0x" << w);
        }
      }
    }
  }
}

TEST_CASE("vector conversions equal the scalar ones", "[reduce][convert][isa]") {
  std::vector<float> in;
  for (DataType t : kSmallTypes) {
    std::vector<uint32_t> ignored;
    const std::vector<float> p = tieProbes(t, &ignored);
    in.insert(in.end(), p.begin(), p.end());
  }
  std::mt19937 rng(99);
  for (int i = 0; i < 300000; ++i) in.push_back(bitsFloat(rng()));
  for (uint32_t b : {0x7F800001u, 0x7FC00000u, 0xFFC00000u, 0x7FFFFFFFu, 0xFF800001u, 0x00000001u,
                     0x807FFFFFu, 0x00800000u})
    in.push_back(bitsFloat(b));
  checkFromFloatPaths(in);
}

TEST_CASE("vector conversions equal the scalar ones for all 2^32 floats",
          "[.exhaustive][reduce][convert][isa]") {
  std::vector<float> in(1u << 24);
  for (uint64_t base = 0; base < (1ull << 32); base += in.size()) {
    for (size_t i = 0; i < in.size(); ++i) in[i] = bitsFloat(uint32_t(base + i));
    checkFromFloatPaths(in);
  }
}

TEST_CASE("fromDouble rounds once / integers round to even and saturate", "[reduce][convert]") {
  // 1 + 2^-11 + 2^-40 is just above a half midpoint: correctly rounded it goes
  // up; rounding through float first would make it a tie that goes down.
  uint16_t h = 0;
  fromDouble(DataType::kFloat16, 1.0 + 0x1p-11 + 0x1p-40, &h);
  REQUIRE(h == 0x3C01);
  fromDouble(DataType::kFloat16, 1.0 + 0x1p-11, &h);
  REQUIRE(h == 0x3C00);
  uint16_t b = 0;
  fromDouble(DataType::kBfloat16, 1.0 + 0x1p-8 + 0x1p-40, &b);
  REQUIRE(b == 0x3F81);
  uint8_t e = 0;
  fromDouble(DataType::kFloat8e4m3, 1.0 + 0x1p-4 + 0x1p-40, &e);
  REQUIRE(e == 0x39);
  fromDouble(DataType::kFloat8e5m2, 1e10, &e);
  REQUIRE(e == formatOf(DataType::kFloat8e5m2).overflowCode);
  fromDouble(DataType::kFloat16, 1e-300, &h);
  REQUIRE(h == 0);
  float f = 0;
  fromDouble(DataType::kFloat32, 1.0 / 3.0, &f);
  REQUIRE(f == float(1.0 / 3.0));
  double d = 0;
  fromDouble(DataType::kFloat64, 0.1, &d);
  REQUIRE(d == 0.1);

  int8_t i8 = 0;
  fromDouble(DataType::kInt8, 2.5, &i8);
  REQUIRE(i8 == 2);
  fromDouble(DataType::kInt8, 3.5, &i8);
  REQUIRE(i8 == 4);
  fromDouble(DataType::kInt8, -2.5, &i8);
  REQUIRE(i8 == -2);
  fromDouble(DataType::kInt8, 300, &i8);
  REQUIRE(i8 == 127);
  fromDouble(DataType::kInt8, -300, &i8);
  REQUIRE(i8 == -128);
  uint8_t u8 = 9;
  fromDouble(DataType::kUint8, -1, &u8);
  REQUIRE(u8 == 0);
  fromDouble(DataType::kUint8, std::nan(""), &u8);
  REQUIRE(u8 == 0);
  uint64_t u64 = 0;
  fromDouble(DataType::kUint64, 1e30, &u64);
  REQUIRE(u64 == UINT64_MAX);
  fromDouble(DataType::kUint64, 0x1p63, &u64);
  REQUIRE(u64 == (1ull << 63));
  int64_t i64 = 0;
  fromDouble(DataType::kInt64, -0x1p63, &i64);
  REQUIRE(i64 == INT64_MIN);
  fromDouble(DataType::kInt64, 0x1p63, &i64);
  REQUIRE(i64 == INT64_MAX);
  int32_t i32 = 0;
  fromDouble(DataType::kInt32, -7, &i32);
  REQUIRE(toDouble(DataType::kInt32, &i32) == -7);
}

// ---- Reference element operations -------------------------------------------------

template <class S>
S ld(const unsigned char* p, size_t i) {
  S v;
  std::memcpy(&v, p + i * sizeof(S), sizeof(S));
  return v;
}
template <class S>
void st(unsigned char* p, size_t i, S v) {
  std::memcpy(p + i * sizeof(S), &v, sizeof(S));
}

template <class F>
F canonical(F r) {
  if (std::isnan(r)) {
    if constexpr (sizeof(F) == 4) return bitsFloat(kFloatCanonicalNaN);
    else return bitsDouble(kDoubleCanonicalNaN);
  }
  return r;
}

// Max/min by value: NaN operands ignored, two NaNs -> canonical, -0 < +0.
template <class F>
bool refPickA(F a, F b, bool isMax) {  // whether the result is a
  if (a == 0 && b == 0 && std::signbit(a) != std::signbit(b)) {
    return isMax ? !std::signbit(a) : std::signbit(a);
  }
  return isMax ? a >= b : a <= b;
}

template <class T>
T refInt(ReduceOp op, T a, T b, T s) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case ReduceOp::kSum: return T(U(U(a) + U(b)));
    case ReduceOp::kProd: return T(U(U(a) * U(b)));
    case ReduceOp::kMax: return a > b ? a : b;
    case ReduceOp::kMin: return a < b ? a : b;
    case ReduceOp::kPreMulSum: return T(U(U(U(a) * U(s)) + U(b)));
  }
  return 0;
}

template <class F>
F refFloat(ReduceOp op, F a, F b, F s) {
  switch (op) {
    case ReduceOp::kSum: return canonical<F>(a + b);
    case ReduceOp::kProd: return canonical<F>(a * b);
    case ReduceOp::kMax:
    case ReduceOp::kMin: {
      const bool isMax = op == ReduceOp::kMax;
      if (std::isnan(a) && std::isnan(b)) return canonical<F>(a);
      if (std::isnan(a)) return b;
      if (std::isnan(b)) return a;
      return refPickA(a, b, isMax) ? a : b;
    }
    case ReduceOp::kPreMulSum: {
      volatile F t = a * s;  // rounded product, then a separate add
      return canonical<F>(t + b);
    }
  }
  return 0;
}

uint32_t refSmall(DataType t, ReduceOp op, uint32_t a, uint32_t b, uint32_t s) {
  const Format f = formatOf(t);
  const float fa = fromCode(t, a), fb = fromCode(t, b), fs = fromCode(t, s);
  switch (op) {
    case ReduceOp::kSum: return toCode(t, fa + fb);
    case ReduceOp::kProd: return toCode(t, fa * fb);
    case ReduceOp::kMax:
    case ReduceOp::kMin: {
      const bool an = isNanCode(f, a), bn = isNanCode(f, b);
      if (an && bn) return f.nanCode;
      const uint32_t r = an ? b : bn ? a : refPickA(fa, fb, op == ReduceOp::kMax) ? a : b;
      // NCCL takes fp8 max/min in half and converts back saturating: the
      // value is kept, but inf becomes the largest finite value.
      const bool fp8 = t == DataType::kFloat8e4m3 || t == DataType::kFloat8e5m2;
      return fp8 ? toCode(t, fromCode(t, r)) : r;
    }
    case ReduceOp::kPreMulSum: {
      volatile float p = fa * fs;
      const uint32_t t1 = toCode(t, p);
      return toCode(t, fromCode(t, t1) + fb);
    }
  }
  return 0;
}

// dst[i] = op(a[i], b[i]) by the reference, on raw bytes.
void refCombine(ReduceOp op, DataType t, unsigned char* d, const unsigned char* a,
                const unsigned char* b, size_t n, const unsigned char* s) {
  for (size_t i = 0; i < n; ++i) {
    switch (t) {
#define SHOAL_REF_INT(DT, T) \
  case DT: st<T>(d, i, refInt<T>(op, ld<T>(a, i), ld<T>(b, i), ld<T>(s, 0))); break;
      SHOAL_REF_INT(DataType::kInt8, int8_t)
      SHOAL_REF_INT(DataType::kUint8, uint8_t)
      SHOAL_REF_INT(DataType::kInt32, int32_t)
      SHOAL_REF_INT(DataType::kUint32, uint32_t)
      SHOAL_REF_INT(DataType::kInt64, int64_t)
      SHOAL_REF_INT(DataType::kUint64, uint64_t)
#undef SHOAL_REF_INT
      case DataType::kFloat32:
        st<float>(d, i, refFloat<float>(op, ld<float>(a, i), ld<float>(b, i), ld<float>(s, 0)));
        break;
      case DataType::kFloat64:
        st<double>(d, i,
                   refFloat<double>(op, ld<double>(a, i), ld<double>(b, i), ld<double>(s, 0)));
        break;
      case DataType::kFloat16:
      case DataType::kBfloat16:
        st<uint16_t>(d, i,
                     uint16_t(refSmall(t, op, ld<uint16_t>(a, i), ld<uint16_t>(b, i),
                                       ld<uint16_t>(s, 0))));
        break;
      case DataType::kFloat8e4m3:
      case DataType::kFloat8e5m2:
        st<uint8_t>(d, i,
                    uint8_t(refSmall(t, op, ld<uint8_t>(a, i), ld<uint8_t>(b, i),
                                     ld<uint8_t>(s, 0))));
        break;
    }
  }
}

// ---- Input generation ------------------------------------------------------------

std::vector<uint64_t> edgeValues(DataType t) {
  auto f = [](float x) { return uint64_t(floatBits(x)); };
  auto d = [](double x) { return doubleBits(x); };
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8: return {0, 1, 0xFF, 0x80, 0x7F, 0x81, 0x7E, 2};
    case DataType::kInt32:
    case DataType::kUint32:
      return {0, 1, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0x80000001, 0xFFFF, 0x10000};
    case DataType::kInt64:
    case DataType::kUint64:
      return {0, 1, ~0ull, 1ull << 63, (1ull << 63) - 1, (1ull << 63) + 1, 0xFFFFFFFF, 1ull << 32};
    case DataType::kFloat32:
      return {f(0.0f), f(-0.0f), f(1.0f), f(-1.0f), f(INFINITY), f(-INFINITY), 0x7FC00000,
              0xFFC00001, 0x7F800001, 0x7FFFFFFF, f(std::numeric_limits<float>::max()),
              f(-std::numeric_limits<float>::max()), f(std::numeric_limits<float>::min()), 1,
              0x807FFFFF, f(0.5f), f(3.0f), f(1e30f)};
    case DataType::kFloat64:
      return {d(0.0), d(-0.0), d(1.0), d(-1.0), d(INFINITY), d(-INFINITY), 0x7FF8000000000000ull,
              0xFFF8000000000001ull, 0x7FF0000000000001ull, d(std::numeric_limits<double>::max()),
              d(std::numeric_limits<double>::min()), 1, 0x800FFFFFFFFFFFFFull, d(0.5), d(1e300)};
    case DataType::kFloat16:
      return {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
              0x7C01, 0x7E00, 0x7FFF, 0xFFFF, 0x3C00, 0xBC00, 0x3C01, 0x5BFF, 0x1400};
    case DataType::kBfloat16:
      return {0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80,
              0x7F81, 0x7FC0, 0x7FFF, 0xFFFF, 0x3F80, 0xBF80, 0x3F81, 0x0100};
    case DataType::kFloat8e4m3:
      return {0x00, 0x80, 0x01, 0x81, 0x07, 0x08, 0x7E, 0xFE, 0x7F, 0xFF, 0x38, 0xB8, 0x39,
              0x77, 0x3F};
    case DataType::kFloat8e5m2:
      return {0x00, 0x80, 0x01, 0x81, 0x03, 0x04, 0x7B, 0xFB, 0x7C, 0xFC, 0x7D, 0x7E, 0x7F,
              0xFF, 0x3C, 0xBC, 0x3D, 0x5B};
  }
  return {};
}

// One random element (as raw bits in the low bytes).
uint64_t randomElement(DataType t, std::mt19937_64& rng) {
  const std::vector<uint64_t> edges = edgeValues(t);
  const uint64_t r = rng();
  switch (r % 4) {
    case 0: return edges[(r >> 8) % edges.size()];
    case 1:  // small magnitudes: integers stay near 0, floats near 1
      if (t == DataType::kFloat32) {
        return floatBits(std::ldexp(float((r >> 8) % 2048) - 1024.0f, int((r >> 30) % 24) - 14));
      }
      if (t == DataType::kFloat64) {
        return doubleBits(std::ldexp(double((r >> 8) % 1000001) - 500000, int((r >> 30) % 60) - 30));
      }
      if (t == DataType::kFloat16 || t == DataType::kBfloat16 || t == DataType::kFloat8e4m3 ||
          t == DataType::kFloat8e5m2) {
        return toCode(t, std::ldexp(float((r >> 8) % 64) - 32.0f, int((r >> 20) % 10) - 6));
      }
      return (r >> 8) % 7 - 3;
    default: return rng();
  }
}

void fillRandom(DataType t, unsigned char* p, size_t n, std::mt19937_64& rng) {
  const size_t es = dataTypeSize(t);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t v = randomElement(t, rng);
    std::memcpy(p + i * es, &v, es);  // little-endian: the low bytes
  }
}

std::string hexElement(const unsigned char* p, size_t es) {
  uint64_t v = 0;
  std::memcpy(&v, p, es);
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- Combine tests ----------------------------------------------------------------

constexpr size_t kGuard = 64;
constexpr unsigned char kSentinel = 0xA5;

enum class Placement { kOutOfPlace, kDstIsA, kDstIsB };

// Runs one combine on buffers placed at byte offset `offset` and checks it
// against the reference; also that no byte outside dst changed.
void checkCombine(ReduceOp op, DataType t, size_t n, size_t offset, Placement place,
                  std::mt19937_64& rng) {
  const size_t es = dataTypeSize(t);
  const size_t bytes = n * es;
  std::vector<unsigned char> abuf(bytes + 2 * kGuard, kSentinel), bbuf(bytes + 2 * kGuard, kSentinel),
      dbuf(bytes + 2 * kGuard, kSentinel), want(bytes + 1);
  unsigned char* a = abuf.data() + kGuard + offset;
  unsigned char* b = bbuf.data() + kGuard + (offset * 3) % 8;
  fillRandom(t, a, n, rng);
  fillRandom(t, b, n, rng);
  unsigned char scalar[8] = {};
  const uint64_t sv = randomElement(t, rng);
  std::memcpy(scalar, &sv, es);
  refCombine(op, t, want.data(), a, b, n, scalar);

  unsigned char* d = dbuf.data() + kGuard + (offset * 5) % 8;
  std::vector<unsigned char> aSaved(a, a + bytes), bSaved(b, b + bytes);
  if (place == Placement::kDstIsA) d = a;
  if (place == Placement::kDstIsB) d = b;
  combine(op, t, d, a, b, n, scalar);

  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(d + i * es, want.data() + i * es, es) != 0) {
      FAIL(reduceOpName(op) << " " << dataTypeName(t) << " on " << isaName() << " n=" << n
                            << " offset=" << offset << " place=" << int(place) << " element " << i
                            << ": a=" << hexElement(&aSaved[i * es], es)
                            << " b=" << hexElement(&bSaved[i * es], es)
                            << " scalar=" << hexElement(scalar, es) << " got "
                            << hexElement(d + i * es, es) << " want "
                            << hexElement(want.data() + i * es, es));
    }
  }
  // Guard bytes: nothing written outside [d, d + bytes).
  std::vector<unsigned char>& buf = place == Placement::kDstIsA   ? abuf
                                    : place == Placement::kDstIsB ? bbuf
                                                                  : dbuf;
  for (size_t i = 0; i < buf.size(); ++i) {
    const unsigned char* q = buf.data() + i;
    if (q >= d && q < d + bytes) continue;
    if (*q != kSentinel) FAIL("byte written outside dst at " << int64_t(q - d));
  }
}

TEST_CASE("combine: every type and op on every path matches the reference",
          "[reduce][combine][isa]") {
  IsaList isas;
  std::mt19937_64 rng(42);
  std::vector<size_t> counts;
  for (size_t n = 0; n <= 67; ++n) counts.push_back(n);
  for (size_t n : {127, 128, 129, 255, 256, 257, 1000, 4099}) counts.push_back(n);
  for (const std::string& isa : isas.names) {
    REQUIRE(setIsaForTesting(isa.c_str()));
    REQUIRE(std::string(isaName()) == isa);
    for (DataType t : kAllTypes) {
      for (ReduceOp op : kAllOps) {
        for (size_t n : counts) {
          for (size_t offset : {size_t(0), size_t(1), size_t(3), size_t(dataTypeSize(t))}) {
            checkCombine(op, t, n, offset, Placement::kOutOfPlace, rng);
          }
          checkCombine(op, t, n, n % 5, Placement::kDstIsA, rng);
          checkCombine(op, t, n, n % 7, Placement::kDstIsB, rng);
        }
      }
    }
  }
}

// fp8 has 256 codes: check every operand pair, and every scalar for
// premulsum and scale, on every path.
TEST_CASE("combine: all pairs of fp8 codes / all scalars", "[reduce][combine][isa]") {
  IsaList isas;
  for (DataType t : {DataType::kFloat8e4m3, DataType::kFloat8e5m2}) {
    std::vector<uint8_t> a(65536), b(65536), want(65536), got(65536), negZero(65536, 0x80);
    for (uint32_t i = 0; i < 65536; ++i) {
      a[i] = uint8_t(i & 0xFF);
      b[i] = uint8_t(i >> 8);
    }
    auto check = [&](const char* what, const std::string& isa, uint32_t s) {
      for (uint32_t i = 0; i < 65536; ++i) {
        if (got[i] != want[i]) {
          FAIL(dataTypeName(t) << " " << what << " " << isa << " a=" << int(a[i])
                               << " b=" << int(b[i]) << " s=" << s << " got " << int(got[i])
                               << " want " << int(want[i]));
        }
      }
    };
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin}) {
      const uint8_t unused = 0;
      refCombine(op, t, want.data(), a.data(), b.data(), 65536, &unused);
      for (const std::string& isa : isas.names) {
        REQUIRE(setIsaForTesting(isa.c_str()));
        combine(op, t, got.data(), a.data(), b.data(), 65536);
        check(reduceOpName(op), isa, 0);
      }
    }
    for (uint32_t s = 0; s < 256; ++s) {
      const uint8_t sc = uint8_t(s);
      refCombine(ReduceOp::kPreMulSum, t, want.data(), a.data(), b.data(), 65536, &sc);
      for (const std::string& isa : isas.names) {
        REQUIRE(setIsaForTesting(isa.c_str()));
        combine(ReduceOp::kPreMulSum, t, got.data(), a.data(), b.data(), 65536, &sc);
        check("premulsum", isa, s);
      }
      // scale(a) = round(a*s), the premulsum with b = -0.
      refCombine(ReduceOp::kPreMulSum, t, want.data(), a.data(), negZero.data(), 256, &sc);
      for (const std::string& isa : isas.names) {
        REQUIRE(setIsaForTesting(isa.c_str()));
        scale(t, got.data(), a.data(), 256, &sc);
        for (uint32_t i = 0; i < 256; ++i) {
          if (got[i] != want[i]) {
            FAIL(dataTypeName(t) << " scale " << isa << " a=" << i << " s=" << s << " got "
                                 << int(got[i]) << " want " << int(want[i]));
          }
        }
      }
    }
  }
}

#if defined(__x86_64__)
// With flush-to-zero and denormals-are-zero set (as some applications do), the
// float arithmetic changes, but every path must still agree with the scalar one.
TEST_CASE("combine: paths agree under FTZ/DAZ", "[reduce][combine][isa]") {
  IsaList isas;
  std::mt19937_64 rng(5);
  const unsigned int saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // FTZ | DAZ
  for (DataType t : kAllTypes) {
    if (!isFloating(t)) continue;
    const size_t es = dataTypeSize(t), n = 4099;
    std::vector<unsigned char> a(n * es), b(n * es), want(n * es), got(n * es);
    fillRandom(t, a.data(), n, rng);
    fillRandom(t, b.data(), n, rng);
    unsigned char sc[8] = {};
    const uint64_t sv = randomElement(t, rng);
    std::memcpy(sc, &sv, es);
    for (ReduceOp op : kAllOps) {
      setIsaForTesting("scalar");
      combine(op, t, want.data(), a.data(), b.data(), n, sc);
      for (const std::string& isa : isas.names) {
        setIsaForTesting(isa.c_str());
        combine(op, t, got.data(), a.data(), b.data(), n, sc);
        if (got != want) {
          _mm_setcsr(saved);
          FAIL(reduceOpName(op) << " " << dataTypeName(t) << " differs on " << isa);
        }
      }
    }
  }
  _mm_setcsr(saved);
}
#endif

// Specific numerics, written out.
template <class T>
T run(ReduceOp op, DataType t, T a, T b, T s = T{}) {
  T r{};
  combine(op, t, &r, &a, &b, 1, &s);
  return r;
}

TEST_CASE("combine: documented numerics", "[reduce][combine][isa]") {
  IsaList isas;
  for (const std::string& isa : isas.names) {
    INFO(isa);
    REQUIRE(setIsaForTesting(isa.c_str()));
    // Integers wrap; max/min are exact.
    REQUIRE(run<int8_t>(ReduceOp::kSum, DataType::kInt8, 127, 1) == -128);
    REQUIRE(run<int32_t>(ReduceOp::kProd, DataType::kInt32, INT32_MIN, -1) == INT32_MIN);
    REQUIRE(run<uint64_t>(ReduceOp::kProd, DataType::kUint64, 1ull << 63, 2) == 0);
    REQUIRE(run<uint8_t>(ReduceOp::kMax, DataType::kUint8, 200, 100) == 200);
    REQUIRE(run<int8_t>(ReduceOp::kMax, DataType::kInt8, -56, 100) == 100);
    REQUIRE(run<int64_t>(ReduceOp::kMin, DataType::kInt64, INT64_MIN, INT64_MAX) == INT64_MIN);
    REQUIRE(run<uint64_t>(ReduceOp::kMin, DataType::kUint64, ~0ull, 1) == 1);
    REQUIRE(run<int32_t>(ReduceOp::kPreMulSum, DataType::kInt32, 3, 4, 5) == 19);

    // Overflow: half -> inf (65504 + 16 = 65520 is a tie to the even inf).
    REQUIRE(run<uint16_t>(ReduceOp::kSum, DataType::kFloat16, 0x7BFF, 0x4C00) == 0x7C00);
    REQUIRE(run<uint16_t>(ReduceOp::kSum, DataType::kFloat16, 0x7BFF, 0x4B00) == 0x7BFF);
    REQUIRE(run<uint16_t>(ReduceOp::kSum, DataType::kBfloat16, 0x7F7F, 0x7F7F) == 0x7F80);
    // fp8 (codes: e4m3 0x7E 448, 0x68 64, 0x60 32, 0x58 16; e5m2 0x7B 57344,
    // 0x70 8192, 0xC0 -2): sums beyond the largest finite value saturate to
    // it, as NCCL's __NV_SATFINITE conversions do (NaN or inf without it);
    // 448 + 16 = 464 is the tie between 448 and 480 and goes to the even 448.
    REQUIRE(run<uint8_t>(ReduceOp::kSum, DataType::kFloat8e4m3, 0x7E, 0x68) == 0x7E);
    REQUIRE(run<uint8_t>(ReduceOp::kSum, DataType::kFloat8e4m3, 0xFE, 0xE8) == 0xFE);
    REQUIRE(run<uint8_t>(ReduceOp::kSum, DataType::kFloat8e4m3, 0x7E, 0x60) == 0x7E);
    REQUIRE(run<uint8_t>(ReduceOp::kSum, DataType::kFloat8e4m3, 0x7E, 0x58) == 0x7E);
    REQUIRE(run<uint8_t>(ReduceOp::kSum, DataType::kFloat8e5m2, 0x7B, 0x70) == 0x7B);
    REQUIRE(run<uint8_t>(ReduceOp::kProd, DataType::kFloat8e5m2, 0x7B, 0xC0) == 0xFB);
    // Subnormals: the two smallest halves add exactly.
    REQUIRE(run<uint16_t>(ReduceOp::kSum, DataType::kFloat16, 0x0001, 0x0001) == 0x0002);
    REQUIRE(run<uint8_t>(ReduceOp::kSum, DataType::kFloat8e4m3, 0x01, 0x01) == 0x02);

    // NaN: canonical results.
    REQUIRE(floatBits(run<float>(ReduceOp::kSum, DataType::kFloat32, INFINITY, -INFINITY)) ==
            0x7FFFFFFFu);
    REQUIRE(run<uint16_t>(ReduceOp::kProd, DataType::kFloat16, 0x7C00, 0x0000) == 0x7FFF);
    REQUIRE(run<uint16_t>(ReduceOp::kSum, DataType::kBfloat16, 0xFFC1, 0x3F80) == 0x7FFF);
    REQUIRE(run<uint8_t>(ReduceOp::kSum, DataType::kFloat8e5m2, 0x7E, 0x3C) == 0x7F);
    // Max/min ignore a NaN operand, prefer +0 over -0 for max.
    REQUIRE(run<float>(ReduceOp::kMax, DataType::kFloat32, NAN, 2.0f) == 2.0f);
    REQUIRE(run<float>(ReduceOp::kMin, DataType::kFloat32, 2.0f, NAN) == 2.0f);
    REQUIRE(floatBits(run<float>(ReduceOp::kMax, DataType::kFloat32, -0.0f, 0.0f)) == 0);
    REQUIRE(floatBits(run<float>(ReduceOp::kMin, DataType::kFloat32, 0.0f, -0.0f)) == 0x80000000u);
    REQUIRE(run<uint16_t>(ReduceOp::kMax, DataType::kFloat16, 0x7E00, 0xFC00) == 0xFC00);
    REQUIRE(run<uint16_t>(ReduceOp::kMax, DataType::kFloat16, 0x7E01, 0xFE00) == 0x7FFF);
    REQUIRE(run<uint8_t>(ReduceOp::kMin, DataType::kFloat8e4m3, 0xFF, 0xFE) == 0xFE);
    // e5m2 infinities: max/min give the largest finite value, as NCCL's
    // saturating conversion back from half does (0x7C +inf, 0x7B 57344).
    REQUIRE(run<uint8_t>(ReduceOp::kMax, DataType::kFloat8e5m2, 0x7C, 0x00) == 0x7B);
    REQUIRE(run<uint8_t>(ReduceOp::kMax, DataType::kFloat8e5m2, 0x7C, 0x7E) == 0x7B);  // inf, NaN
    REQUIRE(run<uint8_t>(ReduceOp::kMin, DataType::kFloat8e5m2, 0xFC, 0x3C) == 0xFB);
    REQUIRE(run<uint8_t>(ReduceOp::kMin, DataType::kFloat8e5m2, 0x7C, 0x7C) == 0x7B);
    REQUIRE(run<uint8_t>(ReduceOp::kMax, DataType::kFloat8e5m2, 0xFC, 0x80) == 0x80);
    REQUIRE(run<double>(ReduceOp::kMax, DataType::kFloat64, -INFINITY, -1e300) == -1e300);

    // PreMulSum: two roundings, no FMA.
    //   float: (1+2^-23)^2 rounds to 1+2^-22, minus (1+2^-22) is exactly 0
    //   (an FMA would give 2^-46).
    REQUIRE(run<float>(ReduceOp::kPreMulSum, DataType::kFloat32, 1.0f + 0x1p-23f,
                       -(1.0f + 0x1p-22f), 1.0f + 0x1p-23f) == 0.0f);
    REQUIRE(run<double>(ReduceOp::kPreMulSum, DataType::kFloat64, 1.0 + 0x1p-52,
                        -(1.0 + 0x1p-51), 1.0 + 0x1p-52) == 0.0);
    //   half: (1+2^-10)^2 -> 1+2^-9; + 2^-11 is a tie -> even 1+2^-9 (0x3C02);
    //   one rounding of the exact value would give 0x3C03.
    REQUIRE(run<uint16_t>(ReduceOp::kPreMulSum, DataType::kFloat16, 0x3C01, 0x1000, 0x3C01) ==
            0x3C02);
    //   bf16: 1.5 * 0.5 + 0.25 = 1.
    REQUIRE(run<uint16_t>(ReduceOp::kPreMulSum, DataType::kBfloat16, 0x3FC0, 0x3E80, 0x3F00) ==
            0x3F80);
  }
}

// ---- Scale and divide ----------------------------------------------------------------

TEST_CASE("scale: every type on every path matches a times s", "[reduce][scale][isa]") {
  IsaList isas;
  std::mt19937_64 rng(7);
  for (const std::string& isa : isas.names) {
    REQUIRE(setIsaForTesting(isa.c_str()));
    for (DataType t : kAllTypes) {
      const size_t es = dataTypeSize(t);
      for (size_t n : {0, 1, 5, 31, 64, 67, 300}) {
        for (bool inPlace : {false, true}) {
          std::vector<unsigned char> src(n * es + 3), dst(n * es + 3), zero(n * es + 3, 0),
              want(n * es + 1);
          unsigned char* s = src.data() + 1;
          fillRandom(t, s, n, rng);
          unsigned char scalar[8] = {};
          const uint64_t sv = randomElement(t, rng);
          std::memcpy(scalar, &sv, es);
          // a*s is premulsum with b = -0 for floats (x + -0 = x), 0 for ints;
          // NaN products are canonical either way.
          std::vector<unsigned char> negZero(n * es + 1, 0);
          for (size_t i = 0; i < n; ++i) {
            if (isFloating(t)) negZero[i * es + es - 1] = 0x80;
          }
          refCombine(ReduceOp::kPreMulSum, t, want.data(), s, negZero.data(), n, scalar);
          unsigned char* d = inPlace ? s : dst.data() + 2;
          scale(t, d, s, n, scalar);
          for (size_t i = 0; i < n; ++i) {
            if (std::memcmp(d + i * es, want.data() + i * es, es) != 0) {
              FAIL("scale " << dataTypeName(t) << " on " << isa << " n=" << n << " element " << i
                            << " scalar=" << hexElement(scalar, es) << " got "
                            << hexElement(d + i * es, es) << " want "
                            << hexElement(want.data() + i * es, es));
            }
          }
        }
      }
    }
  }
}

template <class T>
T refDivide(T x, uint64_t d) {
  if constexpr (std::is_unsigned_v<T>) {
    return T(uint64_t(x) / d);
  } else {
    return T(__int128(x) / __int128(d));
  }
}

template <class T>
void checkDivide(DataType t, std::mt19937_64& rng, const std::string& isa) {
  const std::vector<uint64_t> divisors = {1, 2, 3, 7, 8, 10, 127, 128, 255, 256, 65535, 65536,
                                          1000003, 0x7FFFFFFF, 0x80000000, 0x80000001, 0xFFFFFFFF,
                                          0x100000000ull, 1ull << 63, ~0ull};
  for (uint64_t div : divisors) {
    for (size_t n : {0, 1, 7, 33, 67, 1500}) {
      std::vector<T> src(n + 1), dst(n + 1), want(n);
      const std::vector<uint64_t> edges = edgeValues(t);
      for (size_t i = 0; i < n; ++i) {
        const uint64_t r = rng();
        src[i + 1] = T(i % 3 == 0 ? edges[r % edges.size()] : r);
      }
      for (size_t i = 0; i < n; ++i) want[i] = refDivide<T>(src[i + 1], div);
      // Misaligned by one element, and in place.
      divide(t, dst.data(), src.data() + 1, n, div);
      for (size_t i = 0; i < n; ++i) {
        if (dst[i] != want[i]) {
          FAIL("divide " << dataTypeName(t) << " on " << isa << " " << int64_t(src[i + 1]) << " / "
                         << div << " gave " << int64_t(dst[i]) << " want " << int64_t(want[i]));
        }
      }
      divide(t, src.data() + 1, src.data() + 1, n, div);
      for (size_t i = 0; i < n; ++i) REQUIRE(src[i + 1] == want[i]);
    }
  }
}

TEST_CASE("divide: integers truncate / signed and unsigned / on every path",
          "[reduce][divide][isa]") {
  IsaList isas;
  std::mt19937_64 rng(11);
  for (const std::string& isa : isas.names) {
    REQUIRE(setIsaForTesting(isa.c_str()));
    checkDivide<int8_t>(DataType::kInt8, rng, isa);
    checkDivide<uint8_t>(DataType::kUint8, rng, isa);
    checkDivide<int32_t>(DataType::kInt32, rng, isa);
    checkDivide<uint32_t>(DataType::kUint32, rng, isa);
    checkDivide<int64_t>(DataType::kInt64, rng, isa);
    checkDivide<uint64_t>(DataType::kUint64, rng, isa);
  }
}

TEST_CASE("divide: floating types give the correctly rounded quotient", "[reduce][divide]") {
  float f[3] = {1.0f, -7.0f, 1e30f};
  divide(DataType::kFloat32, f, f, 3, 3);
  REQUIRE(f[0] == float(1.0 / 3.0));
  REQUIRE(f[1] == float(-7.0 / 3.0));
  REQUIRE(f[2] == float(double(1e30f) / 3.0));
  double d = 1.0;
  divide(DataType::kFloat64, &d, &d, 1, 10);
  REQUIRE(d == 0.1);
  uint16_t h = 0x3C00;  // 1.0
  divide(DataType::kFloat16, &h, &h, 1, 3);
  uint16_t want = 0;
  fromDouble(DataType::kFloat16, 1.0 / 3.0, &want);
  REQUIRE(h == want);
}

TEST_CASE("isaName names the best path this CPU supports", "[reduce]") {
  setIsaForTesting(nullptr);
  const std::string name = isaName();
  if (cpuSupportsIsa("avx512")) {
    REQUIRE(name == "avx512");
  } else if (cpuSupportsIsa("avx2")) {
    REQUIRE(name == "avx2");
  } else {
    REQUIRE(name == "scalar");
  }
  REQUIRE_FALSE(setIsaForTesting("sse9"));
  REQUIRE(std::string(isaName()) == name);
}

}  // namespace
}  // namespace shoal::reduce

TEST_CASE("copy: every byte at every alignment, streaming or not, overlapping ranges like memmove",
          "[reduce][copy]") {
  const size_t big = shoal::reduce::kStreamingCopyMinBytes + 4096 + 37;  // streams, with an odd tail
  std::vector<uint8_t> src(big + 64), dst(big + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{4096}, shoal::reduce::kStreamingCopyMinBytes, big}) {
    for (size_t dstOffset : {size_t{0}, size_t{3}, size_t{16}, size_t{33}}) {
      for (size_t srcOffset : {size_t{0}, size_t{5}}) {
        INFO(bytes << " bytes, dst +" << dstOffset << ", src +" << srcOffset);
        std::fill(dst.begin(), dst.end(), uint8_t{0xEE});
        shoal::reduce::copy(dst.data() + dstOffset, src.data() + srcOffset, bytes);
        REQUIRE(std::memcmp(dst.data() + dstOffset, src.data() + srcOffset, bytes) == 0);
        auto untouched = [](uint8_t v) { return v == 0xEE; };
        REQUIRE(std::all_of(dst.begin(), dst.begin() + static_cast<ptrdiff_t>(dstOffset), untouched));  // nothing before
        REQUIRE(std::all_of(dst.begin() + static_cast<ptrdiff_t>(dstOffset + bytes), dst.end(), untouched));  // nor after
      }
    }
  }
  // Overlapping large ranges, both directions: the result memmove gives.
  for (ptrdiff_t shift : {ptrdiff_t{64}, ptrdiff_t{-64}, ptrdiff_t{1}}) {
    INFO("shift " << shift);
    std::vector<uint8_t> buffer(big + 128), expected;
    for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<uint8_t>(i * 17 + 3);
    expected = buffer;
    uint8_t* from = buffer.data() + 64;
    std::memmove(expected.data() + 64 + shift, expected.data() + 64, big);
    shoal::reduce::copy(from + shift, from, big);
    REQUIRE(buffer == expected);
  }
  // Same address: nothing to do.
  std::vector<uint8_t> same(src.begin(), src.end());
  shoal::reduce::copy(same.data(), same.data(), same.size());
  REQUIRE(same == src);
}
