// The reducer's public entry points and its run-time dispatch: the best path
// the CPU supports (avx512 > avx2 > scalar) is chosen once, on first use.
#include "reduce/reduce.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <emmintrin.h>
#endif

#include "core/status.h"
#include "reduce/numerics.h"
#include "reduce/reduce_internal.h"

namespace shoal::reduce {

void scalarFromDouble(DataType dtype, double v, void* out);  // reduce_scalar.cc

namespace {

bool validType(DataType t) { return int(t) >= 0 && int(t) < kNumDataTypes; }

// Only for a path the CPU supports: building a vector table may run code of
// that path's instruction set.
const Kernels* kernelsByName(const char* name) {
  if (!cpuSupportsIsa(name)) return nullptr;
  if (std::strcmp(name, "scalar") == 0) return &scalarKernels();
  if (std::strcmp(name, "avx2") == 0) return avx2Kernels();
  if (std::strcmp(name, "avx512") == 0) return avx512Kernels();
  return nullptr;
}

const Kernels* chooseAuto() {
  for (const char* name : {"avx512", "avx2"}) {
    const Kernels* k = kernelsByName(name);
    if (k != nullptr) return k;
  }
  return &scalarKernels();
}

std::atomic<const Kernels*> gForced{nullptr};

#if defined(__x86_64__)
// CPUID.1:ECX.F16C[bit 29] (clang's __builtin_cpu_supports lacks "f16c").
bool hasF16c() {
  unsigned int eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}
#endif

const Kernels& active() {
  static const Kernels* const chosen = chooseAuto();
  const Kernels* forced = gForced.load(std::memory_order_relaxed);
  return forced != nullptr ? *forced : *chosen;
}

// Less than one 32-byte register of data goes to the scalar kernels (the same
// bytes on every path): the vector ones would load and store it in partial
// registers, three libc memcpy calls on AVX2, ~100 instructions for the two
// floats of an 8-byte AllReduce against ~20.
constexpr size_t kScalarBelowBytes = 32;

const Kernels& kernelsFor(size_t bytes) {
  return bytes < kScalarBelowBytes ? scalarKernels() : active();
}

template <class T>
void storeInt(double v, void* out) {
  T r;
  if (v != v) {
    r = 0;
  } else {
    const double n = std::nearbyint(v);  // ties to even in the default mode
    if (n <= double(std::numeric_limits<T>::min())) {
      r = std::numeric_limits<T>::min();
    } else if (n >= std::ldexp(1.0, std::numeric_limits<T>::digits) ) {
      r = std::numeric_limits<T>::max();
    } else {
      r = T(n);
    }
  }
  std::memcpy(out, &r, sizeof r);
}

template <class T>
double loadInt(const void* in) {
  T v;
  std::memcpy(&v, in, sizeof v);
  return double(v);
}

}  // namespace

bool cpuSupportsIsa(const char* name) {
  if (std::strcmp(name, "scalar") == 0) return true;
#if defined(__x86_64__)
  // __builtin_cpu_supports also checks that the OS saves the wider registers.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") && hasF16c();
  if (std::strcmp(name, "avx2") == 0) return avx2;
  if (std::strcmp(name, "avx512") == 0) {
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
#endif
  return false;
}

bool setIsaForTesting(const char* name) {
  if (name == nullptr || std::strcmp(name, "auto") == 0) {
    gForced.store(nullptr);
    return true;
  }
  const Kernels* k = kernelsByName(name);
  if (k == nullptr) return false;
  gForced.store(k);
  return true;
}

void fromFloatForTesting(DataType dtype, void* dst, const float* src, size_t count) {
  SHOAL_CHECK(validType(dtype) && active().fromFloat[int(dtype)] != nullptr,
              "fromFloat needs a floating type");
  active().fromFloat[int(dtype)](dst, src, count);
}

const char* isaName() { return active().name; }

void combine(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, size_t count,
             const void* scalar) {
  SHOAL_CHECK(unsigned(op) < unsigned(kNumReduceOps), "bad reduce op ", int(op));
  SHOAL_CHECK(validType(dtype), "bad data type ", int(dtype));
  SHOAL_CHECK(op != ReduceOp::kPreMulSum || scalar != nullptr, "premulsum needs a scalar");
  if (count == 0) return;
  kernelsFor(count * dataTypeSize(dtype)).combine[int(op)][int(dtype)](dst, a, b, count, scalar);
}

void scale(DataType dtype, void* dst, const void* src, size_t count, const void* scalar) {
  SHOAL_CHECK(validType(dtype), "bad data type ", int(dtype));
  SHOAL_CHECK(scalar != nullptr, "scale needs a scalar");
  if (count == 0) return;
  kernelsFor(count * dataTypeSize(dtype)).scale[int(dtype)](dst, src, count, scalar);
}

void copy(void* dst, const void* src, size_t bytes) {
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
#if defined(__x86_64__)
  const bool overlap = out < in + bytes && in < out + bytes;
  if (bytes >= kStreamingCopyMinBytes && !overlap) {
    // Non-temporal stores (SSE2, every x86-64) need 16-byte aligned
    // destinations: an ordinary copy up to the first such address and after the last.
    size_t head = (16 - reinterpret_cast<uintptr_t>(out) % 16) % 16;
    std::memcpy(out, in, head);
    size_t at = head;
    for (; at + 64 <= bytes; at += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at + 32));
      __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + at), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + at + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + at + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + at + 48), d);
    }
    std::memcpy(out + at, in + at, bytes - at);
    _mm_sfence();  // ordered before whatever this thread stores next (a completion, a message)
    return;
  }
#endif
  if (out != in && bytes > 0) std::memmove(out, in, bytes);
}

void divide(DataType dtype, void* dst, const void* src, size_t count, uint64_t divisor) {
  SHOAL_CHECK(validType(dtype), "bad data type ", int(dtype));
  SHOAL_CHECK(divisor != 0, "divide by zero");
  if (count == 0) return;
  active().divide[int(dtype)](dst, src, count, divisor);
}

void fromDouble(DataType dtype, double value, void* out) {
  switch (dtype) {
    case DataType::kInt8: return storeInt<int8_t>(value, out);
    case DataType::kUint8: return storeInt<uint8_t>(value, out);
    case DataType::kInt32: return storeInt<int32_t>(value, out);
    case DataType::kUint32: return storeInt<uint32_t>(value, out);
    case DataType::kInt64: return storeInt<int64_t>(value, out);
    case DataType::kUint64: return storeInt<uint64_t>(value, out);
    case DataType::kFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kBfloat16:
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2: return scalarFromDouble(dtype, value, out);
  }
  SHOAL_CHECK(false, "bad data type ", int(dtype));
}

double toDouble(DataType dtype, const void* in) {
  switch (dtype) {
    case DataType::kInt8: return loadInt<int8_t>(in);
    case DataType::kUint8: return loadInt<uint8_t>(in);
    case DataType::kInt32: return loadInt<int32_t>(in);
    case DataType::kUint32: return loadInt<uint32_t>(in);
    case DataType::kInt64: return loadInt<int64_t>(in);
    case DataType::kUint64: return loadInt<uint64_t>(in);
    case DataType::kFloat16: {
      uint16_t c;
      std::memcpy(&c, in, 2);
      return halfToFloat(c);
    }
    case DataType::kBfloat16: {
      uint16_t c;
      std::memcpy(&c, in, 2);
      return bf16ToFloat(c);
    }
    case DataType::kFloat8e4m3: return e4m3ToFloat(*static_cast<const uint8_t*>(in));
    case DataType::kFloat8e5m2: return e5m2ToFloat(*static_cast<const uint8_t*>(in));
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, in, 4);
      return f;
    }
    case DataType::kFloat64: {
      double d;
      std::memcpy(&d, in, 8);
      return d;
    }
  }
  SHOAL_CHECK(false, "bad data type ", int(dtype));
  return 0;
}

}  // namespace shoal::reduce
