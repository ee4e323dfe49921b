// Verifiable data for the perf benchmarks; see verifiable.h for the rules.
#include "verifiable.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace shoal::perf {
namespace {

static_assert(std::endian::native == std::endian::little,
              "elements are stored as the low bytes of a uint64_t");

constexpr TypeInfo kTypes[] = {
    {ncclInt8, "int8", 1, false, true, NCCL_VERSION(2, 0, 0)},
    {ncclUint8, "uint8", 1, false, false, NCCL_VERSION(2, 0, 0)},
    {ncclInt32, "int32", 4, false, true, NCCL_VERSION(2, 0, 0)},
    {ncclUint32, "uint32", 4, false, false, NCCL_VERSION(2, 0, 0)},
    {ncclInt64, "int64", 8, false, true, NCCL_VERSION(2, 0, 0)},
    {ncclUint64, "uint64", 8, false, false, NCCL_VERSION(2, 0, 0)},
    {ncclFloat16, "half", 2, true, true, NCCL_VERSION(2, 0, 0)},
    {ncclFloat32, "float", 4, true, true, NCCL_VERSION(2, 0, 0)},
    {ncclFloat64, "double", 8, true, true, NCCL_VERSION(2, 0, 0)},
    {ncclBfloat16, "bfloat16", 2, true, true, NCCL_VERSION(2, 10, 0)},
    {ncclFloat8e4m3, "f8e4m3", 1, true, true, NCCL_VERSION(2, 24, 0)},
    {ncclFloat8e5m2, "f8e5m2", 1, true, true, NCCL_VERSION(2, 24, 0)},
};

constexpr OpInfo kReductionOps[] = {
    {Op::kSum, "sum", NCCL_VERSION(2, 0, 0)},   {Op::kProd, "prod", NCCL_VERSION(2, 0, 0)},
    {Op::kMax, "max", NCCL_VERSION(2, 0, 0)},   {Op::kMin, "min", NCCL_VERSION(2, 0, 0)},
    {Op::kAvg, "avg", NCCL_VERSION(2, 10, 0)},  {Op::kMulSum, "mulsum", NCCL_VERSION(2, 11, 0)},
};
constexpr OpInfo kNoOp = {Op::kNone, "none", 0};

// ---- Minifloats: half, bfloat16, fp8 e4m3 (finite-only) and fp8 e5m2 ------

struct MiniFloatFormat {
  int exponentBits;
  int mantissaBits;
  bool finiteOnly;  // e4m3: no inf; all-ones exponent and mantissa is NaN
};

constexpr MiniFloatFormat kHalf = {5, 10, false};
constexpr MiniFloatFormat kBfloat16 = {8, 7, false};
constexpr MiniFloatFormat kE4m3 = {4, 3, true};
constexpr MiniFloatFormat kE5m2 = {5, 2, false};

const MiniFloatFormat* miniFloatFormat(ncclDataType_t type) {
  switch (type) {
    case ncclFloat16: return &kHalf;
    case ncclBfloat16: return &kBfloat16;
    case ncclFloat8e4m3: return &kE4m3;
    case ncclFloat8e5m2: return &kE5m2;
    default: return nullptr;
  }
}

uint64_t encodeMiniFloat(const MiniFloatFormat& f, double value) {
  const int bias = (1 << (f.exponentBits - 1)) - 1;
  const uint64_t signBit = uint64_t{std::signbit(value) ? 1u : 0u}
                           << (f.exponentBits + f.mantissaBits);
  const uint64_t nanBits = f.finiteOnly ? (uint64_t{1} << (f.exponentBits + f.mantissaBits)) - 1
                                        : ((uint64_t{1} << (f.exponentBits + 1)) - 1)
                                              << (f.mantissaBits - 1);
  const uint64_t infBits = ((uint64_t{1} << f.exponentBits) - 1) << f.mantissaBits;
  if (std::isnan(value)) return signBit | nanBits;
  const double magnitude = std::fabs(value);
  if (magnitude == 0) return signBit;
  if (std::isinf(magnitude)) return signBit | (f.finiteOnly ? nanBits : infBits);

  // magnitude = m * 2^exponent with m in [1, 2); subnormals share the
  // exponent of the smallest normal. Counting in units of the quantum makes
  // the rounding carry into the exponent field by itself.
  int exponent = std::ilogb(magnitude);
  exponent = std::max(exponent, 1 - bias);
  const double quantum = std::ldexp(1.0, exponent - f.mantissaBits);
  const uint64_t units = static_cast<uint64_t>(std::nearbyint(magnitude / quantum));  // ties to even
  const bool subnormal = exponent == 1 - bias;
  uint64_t bits = subnormal ? units
                            : (static_cast<uint64_t>(exponent + bias) << f.mantissaBits) +
                                  (units - (uint64_t{1} << f.mantissaBits));
  // Overflow: e4m3 has no inf, and its top pattern is NaN (no saturation,
  // as with CUDA's __NV_NOSAT conversion).
  if (f.finiteOnly ? bits >= nanBits : bits >= infBits) {
    return signBit | (f.finiteOnly ? nanBits : infBits);
  }
  return signBit | bits;
}

double decodeMiniFloat(const MiniFloatFormat& f, uint64_t bits) {
  const int bias = (1 << (f.exponentBits - 1)) - 1;
  const uint64_t mantissaMask = (uint64_t{1} << f.mantissaBits) - 1;
  const uint64_t exponentMask = (uint64_t{1} << f.exponentBits) - 1;
  const bool negative = (bits >> (f.exponentBits + f.mantissaBits)) & 1;
  const uint64_t exponentField = (bits >> f.mantissaBits) & exponentMask;
  const uint64_t mantissa = bits & mantissaMask;
  double magnitude;
  if (f.finiteOnly && exponentField == exponentMask && mantissa == mantissaMask) {
    magnitude = std::numeric_limits<double>::quiet_NaN();
  } else if (!f.finiteOnly && exponentField == exponentMask) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN()
                         : std::numeric_limits<double>::infinity();
  } else if (exponentField == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - bias - f.mantissaBits);
  } else {
    magnitude = std::ldexp(static_cast<double>(mantissa | (mantissaMask + 1)),
                           static_cast<int>(exponentField) - bias - f.mantissaBits);
  }
  return negative ? -magnitude : magnitude;
}

// ---- Hashing: the same (seed, rank, index) gives the same value anywhere ----

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Largest n such that every integer in [0, n] is exact in the type, capped
// so that sums over ranks fit every integer width with room to spare.
int64_t exactIntegerLimit(const TypeInfo& t) {
  constexpr int64_t kCap = int64_t{1} << 20;
  switch (t.type) {
    case ncclInt8: return 127;
    case ncclUint8: return 255;
    case ncclFloat16: return 2048;
    case ncclBfloat16: return 256;
    case ncclFloat8e4m3: return 16;
    case ncclFloat8e5m2: return 8;
    default: return kCap;
  }
}

int floorLog2(int64_t v) { return 63 - std::countl_zero(static_cast<uint64_t>(v)); }

int preMulWeight(int rank) { return 1 + (rank & 1); }

}  // namespace

// ---- Type and operator tables -------------------------------------------------

std::span<const TypeInfo> allTypes() { return kTypes; }

const TypeInfo* findType(const char* name) {
  for (const TypeInfo& t : kTypes) {
    if (std::strcmp(t.name, name) == 0) return &t;
  }
  return nullptr;
}

const TypeInfo& typeInfo(ncclDataType_t type) {
  for (const TypeInfo& t : kTypes) {
    if (t.type == type) return t;
  }
  std::abort();  // every ncclDataType_t value is in the table
}

std::span<const OpInfo> allReductionOps() { return kReductionOps; }

const OpInfo* findOp(const char* name) {
  for (const OpInfo& o : kReductionOps) {
    if (std::strcmp(o.name, name) == 0) return &o;
  }
  return nullptr;
}

const OpInfo& opInfo(Op op) {
  for (const OpInfo& o : kReductionOps) {
    if (o.op == op) return o;
  }
  return kNoOp;
}

ncclRedOp_t builtinRedOp(Op op) {
  switch (op) {
    case Op::kSum: return ncclSum;
    case Op::kProd: return ncclProd;
    case Op::kMax: return ncclMax;
    case Op::kMin: return ncclMin;
    case Op::kAvg: return ncclAvg;
    default: return ncclNumOps;
  }
}

// ---- Encoding -----------------------------------------------------------------

uint64_t encodeElement(ncclDataType_t type, double value) {
  if (const MiniFloatFormat* f = miniFloatFormat(type)) return encodeMiniFloat(*f, value);
  if (type == ncclFloat32) return std::bit_cast<uint32_t>(static_cast<float>(value));
  if (type == ncclFloat64) return std::bit_cast<uint64_t>(value);
  const size_t size = typeInfo(type).size;
  const uint64_t bits = static_cast<uint64_t>(static_cast<int64_t>(value));
  return size == 8 ? bits : bits & ((uint64_t{1} << (8 * size)) - 1);
}

double decodeElement(ncclDataType_t type, uint64_t bits) {
  if (const MiniFloatFormat* f = miniFloatFormat(type)) return decodeMiniFloat(*f, bits);
  switch (type) {
    case ncclFloat32: return std::bit_cast<float>(static_cast<uint32_t>(bits));
    case ncclFloat64: return std::bit_cast<double>(bits);
    case ncclInt8: return static_cast<int8_t>(bits);
    case ncclUint8: return static_cast<uint8_t>(bits);
    case ncclInt32: return static_cast<int32_t>(bits);
    case ncclUint32: return static_cast<uint32_t>(bits);
    case ncclInt64: return static_cast<double>(static_cast<int64_t>(bits));
    default: return static_cast<double>(bits);
  }
}

uint64_t ulpDistance(ncclDataType_t type, uint64_t a, uint64_t b) {
  // Sign-magnitude bit patterns map to a monotonic integer line.
  const unsigned width = 8 * static_cast<unsigned>(typeInfo(type).size);
  const uint64_t signBit = uint64_t{1} << (width - 1);
  auto ordered = [signBit](uint64_t bits) {
    const int64_t magnitude = static_cast<int64_t>(bits & (signBit - 1));
    return (bits & signBit) ? -magnitude : magnitude;
  };
  const int64_t x = ordered(a);
  const int64_t y = ordered(b);
  return x > y ? static_cast<uint64_t>(x - y) : static_cast<uint64_t>(y - x);
}

// ---- DataPattern ------------------------------------------------------------------

DataPattern::DataPattern(ncclDataType_t type, Op op, int nranks, uint64_t seed)
    : type_(typeInfo(type)), op_(op), nranks_(nranks), seed_(mix(seed)) {
  const int64_t limit = exactIntegerLimit(type_);
  contributors_ = nranks;
  maxValue_ = limit;
  switch (op) {
    case Op::kNone:
      break;
    case Op::kSum:
      contributors_ = static_cast<int>(std::min<int64_t>(nranks, limit));
      maxValue_ = limit / contributors_;
      break;
    case Op::kMulSum: {
      // Inputs are weighted 1 or 2: stop adding ranks before the weights
      // alone could exceed the limit.
      int64_t weight = 0;
      contributors_ = 0;
      while (contributors_ < nranks && weight + preMulWeight(contributors_) <= limit) {
        weight += preMulWeight(contributors_++);
      }
      maxValue_ = limit / weight;
      break;
    }
    case Op::kAvg:
      contributors_ = std::min(nranks, 2);
      maxValue_ = limit / contributors_;
      break;
    case Op::kProd:
      // Inputs are 1 or 2: at most log2(limit) twos per element.
      contributors_ = std::min(nranks, floorLog2(limit));
      maxValue_ = 2;
      break;
    case Op::kMax:
    case Op::kMin:
      maxValue_ = std::min<int64_t>(limit, 1000);
      break;
  }
}

int64_t DataPattern::inputValue(int rank, size_t index) const {
  const uint64_t h = mix(seed_ ^ mix((static_cast<uint64_t>(rank) << 40) ^ index));
  const bool contributes = rank < contributors_;
  switch (op_) {
    case Op::kNone:
      // Integers: any bit pattern. Floating types: integers in [-limit, limit].
      if (!type_.floating) return static_cast<int64_t>(h);
      return static_cast<int64_t>(h % (2 * static_cast<uint64_t>(maxValue_) + 1)) - maxValue_;
    case Op::kSum:
    case Op::kMulSum:
    case Op::kAvg:
      return contributes ? static_cast<int64_t>(h % static_cast<uint64_t>(maxValue_ + 1)) : 0;
    case Op::kProd:
      return contributes ? 1 + static_cast<int64_t>(h & 1) : 1;
    case Op::kMax:
    case Op::kMin:
      if (!type_.isSigned) return static_cast<int64_t>(h % static_cast<uint64_t>(maxValue_ + 1));
      return static_cast<int64_t>(h % (2 * static_cast<uint64_t>(maxValue_) + 1)) - maxValue_;
  }
  return 0;
}

uint64_t DataPattern::encodeValue(int64_t value) const {
  // Integer patterns may use all 64 bits, which a double cannot carry.
  if (type_.floating) return encodeElement(type_.type, static_cast<double>(value));
  const uint64_t bits = static_cast<uint64_t>(value);
  return type_.size == 8 ? bits : bits & ((uint64_t{1} << (8 * type_.size)) - 1);
}

void DataPattern::writeInput(void* dst, int rank, size_t count) const {
  for (size_t i = 0; i < count; ++i) storeBits(dst, i, encodeValue(inputValue(rank, i)));
}

uint64_t DataPattern::expectedBits(ElementSource source) const {
  if (source.rank != ElementSource::kAllRanks) return encodeValue(inputValue(source.rank, source.index));
  return reducedBits(source.index);
}

uint64_t DataPattern::reducedBits(size_t index) const {
  if (op_ == Op::kAvg && type_.floating) {
    // NCCL's floating avg: x_r * (1/n) rounded to the type, then summed in
    // the type. Only two ranks are non-zero, so the order of the sum cannot
    // matter; the roundings are reproduced exactly.
    auto roundToType = [this](double v) {
      return decodeElement(type_.type, encodeElement(type_.type, v));
    };
    const double scale = roundToType(1.0 / nranks_);
    double sum = 0;
    for (int r = 0; r < contributors_; ++r) {
      sum = roundToType(sum + roundToType(static_cast<double>(inputValue(r, index)) * scale));
    }
    return encodeElement(type_.type, sum);
  }

  int64_t result = inputValue(0, index);
  if (op_ == Op::kMulSum) result *= preMulWeight(0);
  for (int r = 1; r < nranks_; ++r) {
    const int64_t v = inputValue(r, index);
    switch (op_) {
      case Op::kSum:
      case Op::kAvg: result += v; break;
      case Op::kMulSum: result += preMulWeight(r) * v; break;
      case Op::kProd: result *= v; break;
      case Op::kMax: result = std::max(result, v); break;
      case Op::kMin: result = std::min(result, v); break;
      case Op::kNone: break;
    }
  }
  if (op_ == Op::kAvg) result /= nranks_;  // integer avg: sum, then truncating division
  return encodeValue(result);
}

uint64_t preMulScalarBits(ncclDataType_t type, int rank) {
  return encodeElement(type, preMulWeight(rank));
}

void DataPattern::storeBits(void* dst, size_t index, uint64_t bits) const {
  std::memcpy(static_cast<char*>(dst) + index * type_.size, &bits, type_.size);
}

size_t DataPattern::countMismatches(const void* actual, const void* expected, size_t count) const {
  const size_t size = type_.size;
  const auto* a = static_cast<const unsigned char*>(actual);
  const auto* e = static_cast<const unsigned char*>(expected);
  if (!(op_ == Op::kAvg && type_.floating)) {
    size_t wrong = 0;
    for (size_t k = 0; k < count; ++k) {
      wrong += std::memcmp(a + k * size, e + k * size, size) != 0;
    }
    return wrong;
  }
  constexpr uint64_t kAvgUlpTolerance = 2;
  size_t wrong = 0;
  for (size_t k = 0; k < count; ++k) {
    uint64_t got = 0, want = 0;
    std::memcpy(&got, a + k * size, size);
    std::memcpy(&want, e + k * size, size);
    wrong += ulpDistance(type_.type, got, want) > kAvgUlpTolerance;
  }
  return wrong;
}

}  // namespace shoal::perf
