// Private to src/reduce/ and its tests: the per-ISA kernel tables and the
// dispatcher's test hooks.
//
// Each instruction-set path (scalar, avx2, avx512) fills one `Kernels` table.
// The dispatcher picks one table once (the best the CPU supports) and every
// public call in reduce.h indexes it. All paths give bit-identical results;
// tests force each path with setIsaForTesting().
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/types.h"

namespace shoal::reduce {

inline constexpr int kNumReduceOps = 5;

using CombineFn = void (*)(void* dst, const void* a, const void* b, size_t count, const void* scalar);
using ScaleFn = void (*)(void* dst, const void* src, size_t count, const void* scalar);
using DivideFn = void (*)(void* dst, const void* src, size_t count, uint64_t divisor);
// Rounds floats to the type (floating types only; tests of the conversions).
using FromFloatFn = void (*)(void* dst, const float* src, size_t count);

struct Kernels {
  const char* name;
  CombineFn combine[kNumReduceOps][kNumDataTypes];
  ScaleFn scale[kNumDataTypes];
  DivideFn divide[kNumDataTypes];
  FromFloatFn fromFloat[kNumDataTypes];  // null for integer types
};

// Always present.
const Kernels& scalarKernels();
// Null when the path was not compiled in (non-x86 build); callers must also
// check that the CPU supports it (cpuSupportsIsa).
const Kernels* avx2Kernels();
const Kernels* avx512Kernels();

// Whether this CPU can run the path named "scalar", "avx2" or "avx512".
bool cpuSupportsIsa(const char* name);

// Forces the path used by every later call in this process ("scalar", "avx2",
// "avx512"), or the automatic choice for nullptr / "auto". Returns false (and
// changes nothing) if the name is unknown or the CPU cannot run that path.
// Tests only: not thread-safe against concurrent reducer calls.
bool setIsaForTesting(const char* name);

// Converts floats to dtype with the active path (tests of the conversions).
void fromFloatForTesting(DataType dtype, void* dst, const float* src, size_t count);

}  // namespace shoal::reduce
