// The copies of a same-host AllGather in two orders, N threads standing for N
// ranks (collectives/peer_read.cc): mode 0 copies block by
// block, own block first (every thread reads a different source at any
// moment); mode 1 copies chunk by chunk with the sources in the same order on
// every thread (threads that run together read the same lines at about the
// same time, so only one brings each line from memory). Non-temporal stores
// in both, as Shoal's large copies.
//
//   gcc -O2 -pthread -o /tmp/agorder bench/compare/allgather_read_order.c
//   /tmp/agorder NTHREADS BLOCK_MIB CHUNK_KIB MODE ITERS   e.g. 2 32 4096 1 9
#define _GNU_SOURCE
#include <emmintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static int n; static size_t block, chunk; static int mode; static int iters;
static uint8_t **src, **dst; static pthread_barrier_t bar;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void ntcopy(uint8_t* out,const uint8_t* in,size_t bytes){
  for(size_t at=0;at+64<=bytes;at+=64){
    __m128i a=_mm_loadu_si128((const __m128i*)(in+at)),b=_mm_loadu_si128((const __m128i*)(in+at+16)),
            c=_mm_loadu_si128((const __m128i*)(in+at+32)),d=_mm_loadu_si128((const __m128i*)(in+at+48));
    _mm_stream_si128((__m128i*)(out+at),a);_mm_stream_si128((__m128i*)(out+at+16),b);
    _mm_stream_si128((__m128i*)(out+at+32),c);_mm_stream_si128((__m128i*)(out+at+48),d);}
  _mm_sfence();}
static double times[64];
static void* run(void* arg){int r=(int)(intptr_t)arg;
  for(int it=0;it<iters;it++){pthread_barrier_wait(&bar);double t0=now();
    if(mode==0){ // own block, then each peer's block, whole
      for(int d=0;d<n;d++){int q=(r+d)%n; ntcopy(dst[r]+q*block,src[q],block);} }
    else { // chunk k of every source, sources in the same order on every rank
      for(size_t k=0;k<block;k+=chunk) for(int q=0;q<n;q++) ntcopy(dst[r]+q*block+k,src[q]+k,chunk); }
    pthread_barrier_wait(&bar); if(r==0) times[it]=now()-t0;}
  return 0;}
int main(int argc,char**argv){n=atoi(argv[1]);block=(size_t)atol(argv[2])<<20;chunk=(size_t)atol(argv[3])<<10;mode=atoi(argv[4]);iters=atoi(argv[5]);
  src=malloc(n*sizeof*src);dst=malloc(n*sizeof*dst);
  for(int i=0;i<n;i++){src[i]=aligned_alloc(4096,block);dst[i]=aligned_alloc(4096,block*n);memset(src[i],i+1,block);memset(dst[i],0,block*n);}
  pthread_barrier_init(&bar,0,n);pthread_t th[8];
  for(int i=0;i<n;i++)pthread_create(&th[i],0,run,(void*)(intptr_t)i);
  for(int i=0;i<n;i++)pthread_join(th[i],0);
  double s[64];memcpy(s,times,sizeof(double)*iters);
  for(int i=0;i<iters;i++)for(int j=i+1;j<iters;j++)if(s[j]<s[i]){double x=s[i];s[i]=s[j];s[j]=x;}
  printf("n=%d block=%zuMiB chunk=%zuKiB mode=%d median %.2f ms busbw %.2f GB/s\n",n,block>>20,chunk>>10,mode,s[iters/2]*1e3,(double)block*(n-1)/s[iters/2]/1e9);
  for(int i=0;i<n;i++) for(int q=0;q<n;q++) if(dst[i][q*block]!=q+1||dst[i][q*block+block-1]!=q+1){printf("bad\n");return 1;}
  return 0;}
