// Open MPI's AllReduce / AllGather / ReduceScatter (float sum, out of place)
// under the nccl-tests conventions of coll_common.h, for bench/compare.
//
//   mpirun -np 2 --mca pml ob1 --mca btl vader,self mpi_coll_bench -o allreduce -b 8 -e 64M
//
// Per size: `-w` untimed calls, a barrier, `-n` timed calls (call i on the
// buffers' window i mod (buffer / call size), as nccl-tests); each rank's time
// per call is combined over ranks (mean with -a 1, the default as in
// nccl-tests; max with -a 3). Then one checked call (-c 1) on fresh inputs.
// MPI_Reduce_scatter_block is the reduce_scatter (equal blocks, as NCCL's).
#include <mpi.h>

#include <algorithm>

#include "coll_common.h"

using namespace compare;

namespace {

void collective(Op op, const Shape& s, const float* send, float* recv) {
  switch (op) {
    case Op::kAllReduce:
      MPI_Allreduce(send, recv, static_cast<int>(s.count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case Op::kAllGather:
      MPI_Allgather(send, static_cast<int>(s.count), MPI_FLOAT, recv, static_cast<int>(s.count),
                    MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case Op::kReduceScatter:
      MPI_Reduce_scatter_block(send, recv, static_cast<int>(s.count), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
      break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);

  Options o;
  if (!parseOptions(argc, argv, &o, "")) {
    MPI_Finalize();
    return 2;
  }
  const std::vector<size_t> sizes = sweep(o);
  const Shape largest = shapeFor(o.op, sizes.back(), nranks);
  if (largest.count > static_cast<size_t>(INT32_MAX)) {
    if (rank == 0) std::fprintf(stderr, "-e too large for MPI's int counts\n");
    MPI_Finalize();
    return 2;
  }
  // Allocated and first-touched once, at the largest size, both at the larger
  // of the two sizes, as Shoal's perf (and nccl-tests) do.
  const size_t bufferCount = std::max(largest.sendCount, largest.recvCount);
  float* send = static_cast<float*>(allocPages(bufferCount * sizeof(float)));
  float* recv = static_cast<float*>(allocPages(bufferCount * sizeof(float)));

  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string lib(version);
  lib = lib.substr(0, lib.find(','));
  Report report(o, "mpi_coll_bench", nranks, lib);
  if (rank == 0) report.header();

  for (size_t size : sizes) {
    const Shape s = shapeFor(o.op, size, nranks);
    if (s.count == 0) continue;
    fillInput(send, s.sendCount, rank);

    // Call i uses the buffers' window i mod (buffer / call size), as
    // nccl-tests and Shoal's perf do, so every library reads and writes the
    // same amount of memory that is not already in cache.
    const size_t larger = std::max(s.sendCount, s.recvCount);
    const size_t windows = std::max<size_t>(bufferCount / larger, 1);
    auto call = [&](int i) {
      const size_t shift = larger * (static_cast<size_t>(i) % windows);
      collective(o.op, s, send + shift, recv + shift);
    };
    for (int w = 0; w < o.warmup; ++w) call(w);
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    for (int i = 0; i < o.iters; ++i) call(i);
    const double mine = (MPI_Wtime() - start) / o.iters;
    double combined = 0;
    MPI_Allreduce(&mine, &combined, 1, MPI_DOUBLE, o.average == 3 ? MPI_MAX : MPI_SUM,
                  MPI_COMM_WORLD);
    if (o.average != 3) combined /= nranks;

    int64_t wrong = -1;
    if (o.check) {
      fillInput(send, s.sendCount, rank);
      std::memset(recv, 0, s.recvCount * sizeof(float));
      collective(o.op, s, send, recv);
      const int64_t myWrong = countWrong(o.op, s, recv, rank, nranks);
      MPI_Allreduce(&myWrong, &wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    }
    if (rank == 0) report.row(s, measurement(o.op, s, nranks, combined, wrong), std::nullopt);
  }

  int status = 0;
  if (rank == 0) status = report.finish();
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::free(send);
  std::free(recv);
  MPI_Finalize();
  return status;
}
