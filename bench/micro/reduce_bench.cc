// Throughput of the reducer (src/reduce/): GB/s of combine() per data type
// and operator at three buffer sizes, counting the bytes of dst, a and b.
//
//   reduce_bench --benchmark_filter='combine/sum/float/'
//   reduce_bench --benchmark_min_time=0.05
//
// Names: combine/<op>/<type>/<size>[/<isa>]; without /<isa> the automatic
// choice runs. Buffers are 64-byte aligned, filled with ordinary values (no
// NaN or subnormal operands) and touched before timing.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/types.h"
#include "reduce/reduce.h"
#include "reduce/reduce_internal.h"

namespace {

using shoal::DataType;
using shoal::ReduceOp;
namespace reduce = shoal::reduce;

struct Buffer {
  explicit Buffer(size_t bytes) : p(static_cast<unsigned char*>(std::aligned_alloc(64, bytes))) {}
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  unsigned char* p;
};

// Values near 1 (products stay finite and normal for thousands of passes).
void fill(DataType t, unsigned char* p, size_t count, double base) {
  const size_t es = shoal::dataTypeSize(t);
  unsigned char v[8][8];
  for (int k = 0; k < 8; ++k) reduce::fromDouble(t, base + k * 0.0625, v[k]);
  for (size_t i = 0; i < count; ++i) std::memcpy(p + i * es, v[i % 8], es);
}

void runCombine(benchmark::State& state, ReduceOp op, DataType t, size_t bytes, const char* isa) {
  if (isa != nullptr && !reduce::setIsaForTesting(isa)) {
    state.SkipWithError("ISA not supported on this CPU");
    return;
  }
  const size_t es = shoal::dataTypeSize(t);
  const size_t count = bytes / es;
  Buffer a(bytes), b(bytes), d(bytes);
  fill(t, a.p, count, 1.0);
  fill(t, b.p, count, 1.0);
  std::memset(d.p, 0, bytes);
  unsigned char scalar[8];
  reduce::fromDouble(t, 1.0, scalar);
  for (auto _ : state) {
    reduce::combine(op, t, d.p, a.p, b.p, count, scalar);
    benchmark::DoNotOptimize(d.p);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(3 * bytes));
  state.SetLabel(reduce::isaName());
  reduce::setIsaForTesting(nullptr);
}

void runDivide(benchmark::State& state, DataType t, size_t bytes) {
  const size_t count = bytes / shoal::dataTypeSize(t);
  Buffer a(bytes), d(bytes);
  fill(t, a.p, count, 1000.0);
  for (auto _ : state) {
    reduce::divide(t, d.p, a.p, count, 7);
    benchmark::DoNotOptimize(d.p);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(2 * bytes));
  state.SetLabel(reduce::isaName());
}

std::string sizeName(size_t bytes) {
  return bytes >= (1u << 20) ? std::to_string(bytes >> 20) + "MiB"
                             : std::to_string(bytes >> 10) + "KiB";
}

void registerAll() {
  const size_t sizes[] = {64u << 10, 1u << 20, 64u << 20};
  const DataType all[] = {DataType::kInt8,     DataType::kUint8,      DataType::kInt32,
                          DataType::kUint32,   DataType::kInt64,      DataType::kUint64,
                          DataType::kFloat16,  DataType::kFloat32,    DataType::kFloat64,
                          DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};
  const DataType wide[] = {DataType::kFloat32, DataType::kBfloat16, DataType::kFloat16,
                           DataType::kFloat8e4m3};
  auto add = [](ReduceOp op, DataType t, size_t bytes, const char* isa) {
    std::string name = std::string("combine/") + shoal::reduceOpName(op) + "/" +
                       shoal::dataTypeName(t) + "/" + sizeName(bytes);
    if (isa != nullptr) name += std::string("/") + isa;
    auto* b = benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
      runCombine(s, op, t, bytes, isa);
    });
    b->UseRealTime();
  };
  for (size_t bytes : sizes) {
    for (DataType t : all) add(ReduceOp::kSum, t, bytes, nullptr);
    for (ReduceOp op : {ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kPreMulSum}) {
      for (DataType t : wide) add(op, t, bytes, nullptr);
    }
  }
  // The same kernels on each path, to see what the vector code buys.
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    for (DataType t : {DataType::kFloat32, DataType::kBfloat16, DataType::kFloat16,
                       DataType::kFloat8e4m3}) {
      add(ReduceOp::kSum, t, 1u << 20, isa);
    }
  }
  for (DataType t : {DataType::kInt32, DataType::kInt64}) {
    const std::string name = std::string("divide/") + shoal::dataTypeName(t) + "/1MiB";
    benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
      runDivide(s, t, 1u << 20);
    })->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  registerAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
