/* A program built against NVIDIA's nccl.h and linked with NVIDIA's
 * libnccl.so.2 (found through ldconfig, no rpath), as a user's binary would
 * be. Run with LD_PRELOAD of Shoal's library it must be served by Shoal:
 *   preload_probe shoal   -> exit 0 when Shoal answered and a 1-rank
 *                            AllReduce on host memory gave the right sum
 *   preload_probe nvidia  -> exit 0 when NVIDIA's library answered
 * Prints what it saw either way. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  const char* want = argc > 1 ? argv[1] : "shoal";
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return 10;
  void* shoalSymbol = dlsym(RTLD_DEFAULT, "shoalGetVersionString");
  Dl_info where;
  memset(&where, 0, sizeof where);
  dladdr((void*)ncclGetVersion, &where);
  printf("preload_probe: ncclGetVersion %d from %s; shoalGetVersionString %s\n", version,
         where.dli_fname ? where.dli_fname : "?", shoalSymbol ? "present" : "absent");
  if (strcmp(want, "nvidia") == 0) return shoalSymbol == NULL ? 0 : 1;
  if (shoalSymbol == NULL || version != 23007) return 2;
  ncclUniqueId id;
  ncclComm_t comm;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 3;
  if (ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) return 4;
  float send[4] = {1, 2, 3, 4}, recv[4] = {0, 0, 0, 0};
  if (ncclAllReduce(send, recv, 4, ncclFloat, ncclSum, comm, NULL) != ncclSuccess) return 5;
  if (ncclCommDestroy(comm) != ncclSuccess) return 6;
  if (recv[3] != 4.0f) return 7;
  printf("preload_probe: 1-rank AllReduce through Shoal: %g %g %g %g\n", recv[0], recv[1], recv[2], recv[3]);
  return 0;
}
