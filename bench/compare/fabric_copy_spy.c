/* Counts the large memory copies libfabric makes inside a process
 * (docs/decisions/0007-ofi-lanes-per-channel.md).
 *
 * rxm over libfabric's tcp provider places an expected message straight into
 * the posted receive (the kernel copies it there); a message that arrives
 * before its receive is posted lands in a bounce buffer and is copied with
 * memcpy once the receive comes. So libfabric's memcpy calls of a piece's
 * size count the unexpected messages. LD_PRELOAD it into each rank:
 *
 *   gcc -O2 -fno-builtin -shared -fPIC -o /tmp/fabric_copy_spy.so bench/compare/fabric_copy_spy.c -ldl
 *   env NCCL_NET=Libfabric FI_PROVIDER='tcp;ofi_rxm' SHOAL_SEGMENT_BYTES=131072 \
 *     bash tests/netns/cluster.sh --nodes 2 --ranks-per-node 1 -- \
 *     env LD_PRELOAD=/tmp/fabric_copy_spy.so build/bench/perf/all_reduce_perf -b 8M -e 8M -n 1 -w 5 -N 40 -c 0
 *
 * At exit each process prints one line to stderr: libfabric's memcpy and
 * memset calls of 1 KiB and more, by power of two of the size, e.g.
 *   fabric_copy_spy pid 9925: memcpy 2^13:10168 2^17:1827; memset 2^24:12
 * (2^13: the tcp provider's 9000-byte prefetch of each message's head;
 * 2^17: 128 KiB messages copied out of bounce buffers; 2^24: pools zeroed at
 * set-up). Only calls made from libfabric's own code count (the caller's
 * address against libfabric's loaded segments), and only memcpy and memset:
 * __memcpy_chk, memmove, tail calls (counted against their caller's caller)
 * and provider plugins loaded as separate libraries are missed, so the
 * counts are lower bounds. A forked child that exits reports what it
 * inherited too.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static long copies[64], sets[64];

/* libfabric's loaded address range, found with dl_iterate_phdr; the library
 * may be dlopen'ed after the first copies, so until it is found the search
 * is repeated every 64 calls. Published low bound first, high bound last
 * (release), read high bound first (acquire): a reader that sees the high
 * bound sees the low one. */
static uintptr_t fabric_lo, fabric_hi;

static int find_fabric(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  uintptr_t *range = data;
  if (info->dlpi_name == NULL || strstr(info->dlpi_name, "libfabric") == NULL) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
    if (range[0] == 0 || lo < range[0]) range[0] = lo;
    if (hi > range[1]) range[1] = hi;
  }
  return 1;
}

static int from_fabric(const void *caller) {
  static unsigned misses;
  uintptr_t hi = __atomic_load_n(&fabric_hi, __ATOMIC_ACQUIRE);
  if (hi == 0) {
    if (__atomic_fetch_add(&misses, 1, __ATOMIC_RELAXED) % 64 != 0) return 0;
    uintptr_t range[2] = {0, 0};
    dl_iterate_phdr(find_fabric, range);
    if (range[1] == 0) return 0;
    __atomic_store_n(&fabric_lo, range[0], __ATOMIC_RELEASE);
    __atomic_store_n(&fabric_hi, range[1], __ATOMIC_RELEASE);
    hi = range[1];
  }
  return (uintptr_t)caller >= __atomic_load_n(&fabric_lo, __ATOMIC_RELAXED) && (uintptr_t)caller < hi;
}

static int log2_floor(size_t n) {
  int b = 0;
  while (n > 1) {
    n >>= 1;
    ++b;
  }
  return b;
}

/* The real functions, resolved in a constructor; until then (and should
 * dlsym itself copy) plain byte loops stand in (-fno-builtin keeps gcc from
 * turning them back into calls). */
static void *(*real_memcpy)(void *, const void *, size_t);
static void *(*real_memset)(void *, int, size_t);

__attribute__((optimize("no-tree-loop-distribute-patterns"))) static void *byte_copy(void *dst, const void *src,
                                                                                    size_t n) {
  unsigned char *d = dst;
  const unsigned char *s = src;
  while (n-- > 0) *d++ = *s++;
  return dst;
}

__attribute__((optimize("no-tree-loop-distribute-patterns"))) static void *byte_set(void *dst, int c, size_t n) {
  unsigned char *d = dst;
  while (n-- > 0) *d++ = (unsigned char)c;
  return dst;
}

__attribute__((constructor)) static void resolve(void) {
  real_memcpy = (void *(*)(void *, const void *, size_t))dlsym(RTLD_NEXT, "memcpy");
  real_memset = (void *(*)(void *, int, size_t))dlsym(RTLD_NEXT, "memset");
}

void *memcpy(void *dst, const void *src, size_t n) {
  if (n >= 1024 && from_fabric(__builtin_return_address(0))) __atomic_fetch_add(&copies[log2_floor(n)], 1, __ATOMIC_RELAXED);
  return real_memcpy != NULL ? real_memcpy(dst, src, n) : byte_copy(dst, src, n);
}

void *memset(void *dst, int c, size_t n) {
  if (n >= 1024 && from_fabric(__builtin_return_address(0))) __atomic_fetch_add(&sets[log2_floor(n)], 1, __ATOMIC_RELAXED);
  return real_memset != NULL ? real_memset(dst, c, n) : byte_set(dst, c, n);
}

__attribute__((destructor)) static void report(void) {
  if (__atomic_load_n(&fabric_hi, __ATOMIC_ACQUIRE) == 0) return;  /* libfabric never loaded here */
  char line[2048];
  int at = snprintf(line, sizeof line, "fabric_copy_spy pid %d: memcpy", (int)getpid());
  for (int i = 0; i < 64 && at < (int)sizeof line - 64; ++i)
    if (copies[i] != 0) at += snprintf(line + at, sizeof line - at, " 2^%d:%ld", i, copies[i]);
  at += snprintf(line + at, sizeof line - at, "; memset");
  for (int i = 0; i < 64 && at < (int)sizeof line - 64; ++i)
    if (sets[i] != 0) at += snprintf(line + at, sizeof line - at, " 2^%d:%ld", i, sets[i]);
  fprintf(stderr, "%s\n", line);
}
