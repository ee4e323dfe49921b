/* A program that uses an installed Shoal the way a user's would: through
 * find_package(shoal) or pkg-config, <nccl.h> and <shoal/shoal.h> only.
 * A 1-rank out-of-place AllReduce on host memory (the result must replace
 * what recv held), then 2 ranks of one process in a group (each result is the
 * sum of both ranks' inputs). Prints which libnccl.so.2 served the calls so
 * that the test can check it is the installed one. Exit 0 when every value
 * is right. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <nccl.h>
#include <shoal/shoal.h>

#define N 1024

#define CHECK(call)                                                               \
  do {                                                                            \
    ncclResult_t r_ = (call);                                                     \
    if (r_ != ncclSuccess) {                                                      \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, ncclGetErrorString(r_),      \
              ncclGetLastError(NULL));                                            \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

static float send0[N], send1[N], recv0[N], recv1[N];

int main(void) {
  Dl_info where;
  if (dladdr((void*)&ncclAllReduce, &where) && where.dli_fname) printf("library: %s\n", where.dli_fname);
  printf("version: %s\n", shoalGetVersionString());

  ncclComm_t one;
  CHECK(ncclCommInitAll(&one, 1, NULL));
  for (int i = 0; i < N; ++i) {
    send0[i] = (float)(i % 97);
    recv0[i] = -1.0f;
  }
  CHECK(ncclAllReduce(send0, recv0, N, ncclFloat, ncclSum, one, (cudaStream_t)0));
  for (int i = 0; i < N; ++i)
    if (recv0[i] != (float)(i % 97)) {
      fprintf(stderr, "1 rank: recv[%d] = %g, want %d\n", i, recv0[i], i % 97);
      return 1;
    }
  CHECK(ncclCommDestroy(one));

  ncclComm_t two[2];
  CHECK(ncclCommInitAll(two, 2, NULL));
  for (int i = 0; i < N; ++i) {
    send0[i] = (float)(i % 13);
    send1[i] = (float)(100 + i % 7);
    recv0[i] = recv1[i] = -1.0f;
  }
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(send0, recv0, N, ncclFloat, ncclSum, two[0], (cudaStream_t)0));
  CHECK(ncclAllReduce(send1, recv1, N, ncclFloat, ncclSum, two[1], (cudaStream_t)0));
  CHECK(ncclGroupEnd());
  for (int i = 0; i < N; ++i) {
    float want = (float)(i % 13 + 100 + i % 7);
    if (recv0[i] != want || recv1[i] != want) {
      fprintf(stderr, "2 ranks: recv[%d] = %g, %g, want %g\n", i, recv0[i], recv1[i], want);
      return 1;
    }
  }
  CHECK(ncclCommDestroy(two[0]));
  CHECK(ncclCommDestroy(two[1]));
  printf("allreduce: ok\n");
  return 0;
}
