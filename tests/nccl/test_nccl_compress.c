/* The NCCL interface with WEFT_COMPRESS=fp8e4m3:32:always (set by ctest, with
 * WEFT_NCCL_HOST_MEMORY=1): its bf16 all-reduces and reduce-scatters cross as fp8, so a value
 * e4m3 cannot hold comes back quantized, the same on every rank; what the compression cannot
 * serve (int32, max) and what it does not apply to (all-gather) stay exact. Ranks are threads on
 * host memory. Exit 0 when every check holds. */
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define NRANKS 2
#define COUNT 256

static ncclUniqueId gId;
static int gFailures = 0;
static pthread_mutex_t gLock = PTHREAD_MUTEX_INITIALIZER;

static void fail(int rank, const char* what) {
  pthread_mutex_lock(&gLock);
  fprintf(stderr, "rank %d: %s (%s)\n", rank, what, ncclGetLastError(NULL));
  ++gFailures;
  pthread_mutex_unlock(&gLock);
}

#define CHECK(rank, call)                              \
  do {                                                 \
    if ((call) != ncclSuccess) {                       \
      fail(rank, #call);                               \
      return NULL;                                     \
    }                                                  \
  } while (0)

/* bf16 bit patterns: 1 + 1/64 (between e4m3's 1 and 1.125), 2, and 2 + 1/32. */
enum { kX = 0x3F82, kTwo = 0x4000, kExactSum = 0x4002 };

static void* rankMain(void* arg) {
  const int rank = (int)(long)arg;
  ncclComm_t comm = NULL;
  CHECK(rank, ncclCommInitRank(&comm, NRANKS, gId, rank));
  uint16_t in[COUNT * NRANKS], out[COUNT * NRANKS];
  for (int i = 0; i < COUNT * NRANKS; ++i) in[i] = kX;
  memset(out, 0xff, sizeof out);
  /* Each rank's 1 + 1/64 becomes 1 on the wire: the sum is 2, not 2 + 1/32. */
  CHECK(rank, ncclAllReduce(in, out, COUNT, ncclBfloat16, ncclSum, comm, NULL));
  for (int i = 0; i < COUNT; ++i)
    if (out[i] != kTwo) {
      fail(rank, out[i] == kExactSum ? "all-reduce was not compressed" : "all-reduce value");
      break;
    }
  memset(out, 0xff, sizeof out);
  CHECK(rank, ncclReduceScatter(in, out, COUNT, ncclBfloat16, ncclSum, comm, NULL));
  for (int i = 0; i < COUNT; ++i)
    if (out[i] != kTwo) {
      fail(rank, "reduce-scatter value");
      break;
    }
  /* max cannot be compressed: exact. */
  memset(out, 0xff, sizeof out);
  CHECK(rank, ncclAllReduce(in, out, COUNT, ncclBfloat16, ncclMax, comm, NULL));
  for (int i = 0; i < COUNT; ++i)
    if (out[i] != kX) {
      fail(rank, "all-reduce max value");
      break;
    }
  /* Integers cannot be compressed: exact. */
  int32_t a[COUNT], b[COUNT];
  for (int i = 0; i < COUNT; ++i) a[i] = 1000003 * i + rank;
  CHECK(rank, ncclAllReduce(a, b, COUNT, ncclInt32, ncclSum, comm, NULL));
  for (int i = 0; i < COUNT; ++i)
    if (b[i] != 2 * 1000003 * i + 1) {
      fail(rank, "int32 all-reduce value");
      break;
    }
  /* All-gather is not a sum: WEFT_COMPRESS leaves it exact. */
  memset(out, 0xff, sizeof out);
  CHECK(rank, ncclAllGather(in, out, COUNT, ncclBfloat16, comm, NULL));
  for (int i = 0; i < COUNT * NRANKS; ++i)
    if (out[i] != kX) {
      fail(rank, "all-gather value");
      break;
    }
  CHECK(rank, ncclCommDestroy(comm));
  return NULL;
}

int main(void) {
  if (ncclGetUniqueId(&gId) != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  pthread_t threads[NRANKS];
  for (long r = 0; r < NRANKS; ++r) pthread_create(&threads[r], NULL, rankMain, (void*)r);
  for (int r = 0; r < NRANKS; ++r) pthread_join(threads[r], NULL);
  if (gFailures > 0) {
    fprintf(stderr, "%d check(s) failed\n", gFailures);
    return 1;
  }
  printf("NCCL interface with WEFT_COMPRESS: every check holds\n");
  return 0;
}
