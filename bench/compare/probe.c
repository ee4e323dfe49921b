/* Host-contention probe for bench/compare (docs/performance.md, "The machine").
 *
 * Two processes (parent on CPU 0, child on CPU 1 where there are two CPUs)
 * play ping-pong with a 1 MiB message through shared memory, both spinning:
 * the sender copies the message from its private buffer into the shared
 * slot and raises a flag, the receiver spins on the flag and copies the
 * message out; then the roles swap. One-way time = round trip / 2. On this
 * VM a quiet host reads ~45-50 us; host contention episodes read 100-1500 us.
 *
 *   probe [-s BYTES] [-n ITERS] [-r REPEATS]
 *   probe -F [-s BYTES]     page-fault probe instead (see below)
 *
 * Prints one line:
 *   probe shm_spin 1048576 B one-way us: median 47.10 min 46.90 max 47.74
 * (median, min and max of the per-repeat medians). Exit status 0, or 1 on
 * failure (including a 30 s watchdog).
 *
 * -F: first-touch cost of fresh anonymous memory (mmap, memset, munmap; 64
 * MiB by default, best of 3), the other thing on this VM that varies from
 * hour to hour: a normal Linux host writes fresh pages at several GB/s, this
 * guest at times at 0.2-0.3 GB/s (~15 us per 4 KiB page), which hurts every
 * library that allocates and frees large temporary buffers per call:
 *   probe fault 67108864 B fresh-touch GB/s: 0.27 (us per 4 KiB page: 15.1)
 */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct shared {
  _Alignas(64) atomic_long toChild;   /* sequence number of the message for the child */
  _Alignas(64) atomic_long toParent;  /* ... for the parent */
};

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void pin(int cpu) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set); /* best effort */
}

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void spin_until(atomic_long* flag, long value) {
  while (atomic_load_explicit(flag, memory_order_acquire) != value) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

static int fault_probe(size_t bytes) {
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const double t0 = now_us();
    char* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      perror("mmap");
      return 1;
    }
    memset(p, 1, bytes);
    const double us = now_us() - t0;
    munmap(p, bytes);
    if (us < best) best = us;
  }
  printf("probe fault %zu B fresh-touch GB/s: %.2f (us per 4 KiB page: %.2f)\n", bytes,
         bytes / best / 1e3, best / (bytes / 4096.0));
  return 0;
}

int main(int argc, char** argv) {
  size_t bytes = 1 << 20;
  int iters = 300, repeats = 3;
  int c, faults = 0;
  while ((c = getopt(argc, argv, "s:n:r:F")) != -1) {
    switch (c) {
      case 'F': faults = 1; break;
      case 's': bytes = strtoull(optarg, NULL, 10); break;
      case 'n': iters = atoi(optarg); break;
      case 'r': repeats = atoi(optarg); break;
      default:
        fprintf(stderr, "usage: %s [-s BYTES] [-n ITERS] [-r REPEATS]\n", argv[0]);
        return 2;
    }
  }
  if (bytes == 0 || iters < 1 || repeats < 1 || repeats > 100) return 2;
  if (faults) return fault_probe(bytes == (size_t)1 << 20 ? (size_t)64 << 20 : bytes);

  const size_t header = 4096;
  char* map = mmap(NULL, header + 2 * bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
  if (map == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  struct shared* sh = (struct shared*)map;
  char* slotToChild = map + header;
  char* slotToParent = map + header + bytes;
  atomic_init(&sh->toChild, 0);
  atomic_init(&sh->toParent, 0);
  memset(slotToChild, 1, 2 * bytes);

  char* priv = malloc(bytes);
  if (!priv) return 1;
  memset(priv, 2, bytes);

  const long total = (long)iters * repeats;
  pid_t child = fork();
  if (child < 0) {
    perror("fork");
    return 1;
  }
  alarm(30); /* watchdog: never spin forever if the other side died */
  if (child == 0) {
    pin(1);
    for (long i = 1; i <= total; ++i) {
      spin_until(&sh->toChild, i);
      memcpy(priv, slotToChild, bytes);
      memcpy(slotToParent, priv, bytes);
      atomic_store_explicit(&sh->toParent, i, memory_order_release);
    }
    _exit(0);
  }
  pin(0);
  double medians[100];
  double* rt = malloc(sizeof(double) * (size_t)iters);
  long seq = 0;
  for (int r = 0; r < repeats; ++r) {
    for (int i = 0; i < iters; ++i) {
      const double t0 = now_us();
      ++seq;
      memcpy(slotToChild, priv, bytes);
      atomic_store_explicit(&sh->toChild, seq, memory_order_release);
      spin_until(&sh->toParent, seq);
      memcpy(priv, slotToParent, bytes);
      rt[i] = (now_us() - t0) / 2;
    }
    qsort(rt, (size_t)iters, sizeof(double), cmp_double);
    medians[r] = rt[iters / 2];
  }
  int status = 0;
  waitpid(child, &status, 0);
  qsort(medians, (size_t)repeats, sizeof(double), cmp_double);
  printf("probe shm_spin %zu B one-way us: median %.2f min %.2f max %.2f\n", bytes,
         medians[repeats / 2], medians[0], medians[repeats - 1]);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
