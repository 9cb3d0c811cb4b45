/* A C program built against the system's nccl.h and linked to libweft_nccl.so, as a program
 * built for NCCL would run on weft. Ranks are threads; buffers are host memory with a NULL
 * stream, which weft serves on the host (NCCL itself would want device memory), so this runs
 * without a GPU: it checks the interface (versions, errors, init, collectives, point-to-point,
 * groups, split, what is refused), not the GPU path. Exit 0 when every check holds. */
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NRANKS 4
#define COUNT 1000

static ncclUniqueId gId;
static int gFailures = 0;
static pthread_mutex_t gLock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t gTurns = PTHREAD_MUTEX_INITIALIZER; /* failing calls and their checks */

static void fail(int rank, const char* what, ncclResult_t r) {
  pthread_mutex_lock(&gLock);
  fprintf(stderr, "rank %d: %s: %s (%d): %s\n", rank, what, ncclGetErrorString(r), (int)r,
          ncclGetLastError(NULL));
  ++gFailures;
  pthread_mutex_unlock(&gLock);
}

#define CHECK(rank, call)     \
  do {                        \
    ncclResult_t r_ = (call); \
    if (r_ != ncclSuccess) {  \
      fail(rank, #call, r_);  \
      return NULL;            \
    }                         \
  } while (0)

#define EXPECT(rank, cond)                                   \
  do {                                                       \
    if (!(cond)) fail(rank, "expected " #cond, ncclSuccess); \
  } while (0)

static void* rankMain(void* arg) {
  const int rank = (int)(long)arg;
  ncclComm_t comm = NULL;
  CHECK(rank, ncclCommInitRank(&comm, NRANKS, gId, rank));
  int n = 0, me = -1;
  CHECK(rank, ncclCommCount(comm, &n));
  CHECK(rank, ncclCommUserRank(comm, &me));
  EXPECT(rank, n == NRANKS && me == rank);

  /* all-reduce, sum and avg: every rank's value i + rank. */
  float in[COUNT], out[COUNT];
  for (int i = 0; i < COUNT; ++i) in[i] = (float)(i + rank);
  memset(out, 0xff, sizeof out);
  CHECK(rank, ncclAllReduce(in, out, COUNT, ncclFloat32, ncclSum, comm, NULL));
  for (int i = 0; i < COUNT; ++i) {
    const float want = (float)(NRANKS * i + NRANKS * (NRANKS - 1) / 2);
    if (out[i] != want) {
      fail(rank, "all-reduce sum value", ncclSuccess);
      break;
    }
  }
  CHECK(rank, ncclAllReduce(in, out, COUNT, ncclFloat32, ncclAvg, comm, NULL));
  EXPECT(rank, out[10] == (float)(10 + (NRANKS - 1) / 2.0));

  /* all-gather, reduce-scatter, broadcast (in place through ncclBcast), reduce, all-to-all. */
  int mine[2] = {rank, 100 + rank}, all[2 * NRANKS];
  CHECK(rank, ncclAllGather(mine, all, 2, ncclInt32, comm, NULL));
  for (int q = 0; q < NRANKS; ++q) EXPECT(rank, all[2 * q] == q && all[2 * q + 1] == 100 + q);
  int contrib[NRANKS], piece = -1;
  for (int q = 0; q < NRANKS; ++q) contrib[q] = q * 10 + rank;
  CHECK(rank, ncclReduceScatter(contrib, &piece, 1, ncclInt32, ncclSum, comm, NULL));
  EXPECT(rank, piece == rank * 10 * NRANKS + NRANKS * (NRANKS - 1) / 2);
  double b = rank == 2 ? 3.25 : 0.0;
  CHECK(rank, ncclBcast(&b, 1, ncclFloat64, 2, comm, NULL));
  EXPECT(rank, b == 3.25);
  long long v = rank + 1, total = -1;
  CHECK(rank, ncclReduce(&v, &total, 1, ncclInt64, ncclProd, 0, comm, NULL));
  if (rank == 0) EXPECT(rank, total == 24);
  int sendA[NRANKS], recvA[NRANKS];
  for (int q = 0; q < NRANKS; ++q) sendA[q] = rank * 100 + q;
#if defined(WEFT_NCCL_HAS_AlltoAll) /* nccl.h 2.28 on */
  CHECK(rank, ncclAlltoAll(sendA, recvA, 1, ncclInt32, comm, NULL));
#else
  CHECK(rank, ncclGroupStart());
  for (int q = 0; q < NRANKS; ++q) {
    CHECK(rank, ncclSend(&sendA[q], 1, ncclInt32, q, comm, NULL));
    CHECK(rank, ncclRecv(&recvA[q], 1, ncclInt32, q, comm, NULL));
  }
  CHECK(rank, ncclGroupEnd());
#endif
  for (int q = 0; q < NRANKS; ++q) EXPECT(rank, recvA[q] == q * 100 + rank);

  /* Send/recv around a ring in one group; gather and scatter at root 1. */
  int token = rank * 7, got = -1;
  CHECK(rank, ncclGroupStart());
  CHECK(rank, ncclSend(&token, 1, ncclInt32, (rank + 1) % NRANKS, comm, NULL));
  CHECK(rank, ncclRecv(&got, 1, ncclInt32, (rank + NRANKS - 1) % NRANKS, comm, NULL));
  CHECK(rank, ncclGroupEnd());
  EXPECT(rank, got == ((rank + NRANKS - 1) % NRANKS) * 7);
  int gathered[NRANKS] = {0}, scattered = -1, parts[NRANKS];
  for (int q = 0; q < NRANKS; ++q) parts[q] = 1000 + q;
#if defined(WEFT_NCCL_HAS_Gather) && defined(WEFT_NCCL_HAS_Scatter)
  CHECK(rank, ncclGather(&token, gathered, 1, ncclInt32, 1, comm, NULL));
  if (rank == 1)
    for (int q = 0; q < NRANKS; ++q) EXPECT(rank, gathered[q] == q * 7);
  CHECK(rank, ncclScatter(parts, &scattered, 1, ncclInt32, 1, comm, NULL));
  EXPECT(rank, scattered == 1000 + rank);
#else
  (void)gathered, (void)scattered, (void)parts;
#endif

  /* Split into even and odd ranks (a non-blocking config is accepted). */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclComm_t half = NULL;
  CHECK(rank, ncclCommSplit(comm, rank % 2, rank, &half, &config));
  int halfCount = 0, halfRank = -1;
  CHECK(rank, ncclCommCount(half, &halfCount));
  CHECK(rank, ncclCommUserRank(half, &halfRank));
  EXPECT(rank, halfCount == NRANKS / 2 && halfRank == rank / 2);
  CHECK(rank, ncclCommDestroy(half));

  /* Bad input is an error that names the function; what weft does not do is refused. The last
   * error is the process's, as NCCL's: the ranks take turns failing and reading it. */
  pthread_mutex_lock(&gTurns);
  EXPECT(rank, ncclAllReduce(in, out, COUNT, (ncclDataType_t)99, ncclSum, comm, NULL) ==
                   ncclInvalidArgument);
  EXPECT(rank, strstr(ncclGetLastError(comm), "ncclAllReduce") != NULL);
#if defined(WEFT_NCCL_HAS_CommShrink)
  EXPECT(rank, ncclCommShrink(comm, NULL, 0, NULL, NULL, 0) == ncclInvalidUsage);
  EXPECT(rank, strstr(ncclGetLastError(comm), "ncclCommShrink") != NULL);
#endif
  pthread_mutex_unlock(&gTurns);

  /* PreMulSum: each rank multiplies by its own scalar (rank + 1) before the sum; the scalar is
   * read at creation, so changing it afterwards changes nothing. */
  ncclRedOp_t op;
  float scalar = (float)(rank + 1);
  CHECK(rank, ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
  scalar = 100.0f;
  CHECK(rank, ncclAllReduce(in, out, COUNT, ncclFloat32, op, comm, NULL));
  for (int i = 0; i < COUNT; i += 97) {
    float want = 0;
    for (int q = 0; q < NRANKS; ++q) want += (float)(q + 1) * (float)(i + q);
    EXPECT(rank, out[i] == want);
  }
  EXPECT(rank, ncclAllReduce(in, out, COUNT, ncclInt32, op, comm, NULL) == ncclInvalidArgument);
  CHECK(rank, ncclRedOpDestroy(op, comm));
  EXPECT(rank, ncclRedOpDestroy(op, comm) == ncclInvalidArgument);
  EXPECT(rank, ncclAllReduce(in, out, COUNT, ncclFloat32, op, comm, NULL) == ncclInvalidArgument);
  ncclResult_t async = ncclInternalError;
  CHECK(rank, ncclCommGetAsyncError(comm, &async));
  EXPECT(rank, async == ncclSuccess);
  CHECK(rank, ncclCommFinalize(comm));
  CHECK(rank, ncclCommDestroy(comm));
  return NULL;
}

/* Non-blocking init: ncclInProgress, then ncclCommGetAsyncError until it is done. */
static void* nonBlockingRank(void* arg) {
  const int rank = (int)(long)arg;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, NRANKS, gId, rank, &config);
  if (r != ncclInProgress && r != ncclSuccess) {
    fail(rank, "ncclCommInitRankConfig (non-blocking)", r);
    return NULL;
  }
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) CHECK(rank, ncclCommGetAsyncError(comm, &state));
  EXPECT(rank, state == ncclSuccess);
  int value = 1, sum = 0;
  CHECK(rank, ncclAllReduce(&value, &sum, 1, ncclInt32, ncclSum, comm, NULL));
  EXPECT(rank, sum == NRANKS);
  CHECK(rank, ncclCommDestroy(comm));
  return NULL;
}

static int runRanks(void* (*body)(void*)) {
  if (ncclGetUniqueId(&gId) != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  pthread_t threads[NRANKS];
  for (long r = 0; r < NRANKS; ++r) pthread_create(&threads[r], NULL, body, (void*)r);
  for (int r = 0; r < NRANKS; ++r) pthread_join(threads[r], NULL);
  return 0;
}

/* ncclCommAbort from another thread while ranks 0-2 wait in an all-reduce that rank 3 never
 * joins: every waiting call returns an error long before any timeout. */
static ncclComm_t gAbortComms[NRANKS];
static ncclResult_t gAbortResults[NRANKS];

static void* stuckRank(void* arg) {
  const int rank = (int)(long)arg;
  if (ncclCommInitRank(&gAbortComms[rank], NRANKS, gId, rank) != ncclSuccess) {
    fail(rank, "ncclCommInitRank (abort test)", ncclInvalidUsage);
    return NULL;
  }
  if (rank == NRANKS - 1) return NULL; /* never calls */
  int x = rank, y = 0;
  gAbortResults[rank] = ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, gAbortComms[rank], NULL);
  return NULL;
}

static int abortStuck(void) {
  if (ncclGetUniqueId(&gId) != ncclSuccess) return 1;
  pthread_t threads[NRANKS];
  for (long r = 0; r < NRANKS; ++r) pthread_create(&threads[r], NULL, stuckRank, (void*)r);
  pthread_join(threads[NRANKS - 1], NULL); /* every rank has joined: rank 3 is done init */
  struct timespec pause = {0, 200 * 1000 * 1000};
  nanosleep(&pause, NULL);
  const time_t start = time(NULL);
  if (ncclCommAbort(gAbortComms[0]) != ncclSuccess) fail(0, "ncclCommAbort", ncclInvalidUsage);
  for (int r = 0; r < NRANKS - 1; ++r) pthread_join(threads[r], NULL);
  if (time(NULL) - start > 20) fail(-1, "the aborted calls took more than 20 s", ncclSuccess);
  for (int r = 0; r < NRANKS - 1; ++r) {
    if (gAbortResults[r] == ncclSuccess) fail(r, "a call survived ncclCommAbort", ncclSuccess);
  }
  for (int r = 1; r < NRANKS; ++r) (void)ncclCommDestroy(gAbortComms[r]);
  return 0;
}

/* ncclCommInitAll: every rank in this process, driven from this one thread inside a group. */
static int initAll(void) {
  ncclComm_t comms[NRANKS];
  int devs[NRANKS] = {0};
  if (ncclCommInitAll(comms, NRANKS, devs) != ncclSuccess) {
    fail(-1, "ncclCommInitAll", ncclInvalidUsage);
    return 1;
  }
  int in[NRANKS], out[NRANKS];
  if (ncclGroupStart() != ncclSuccess) return 1;
  for (int r = 0; r < NRANKS; ++r) {
    in[r] = r + 1;
    out[r] = -1;
    if (ncclAllReduce(&in[r], &out[r], 1, ncclInt32, ncclSum, comms[r], NULL) != ncclSuccess)
      fail(r, "ncclAllReduce in a group of every rank", ncclInvalidUsage);
  }
  if (ncclGroupEnd() != ncclSuccess) fail(-1, "ncclGroupEnd", ncclInvalidUsage);
  for (int r = 0; r < NRANKS; ++r) {
    EXPECT(r, out[r] == NRANKS * (NRANKS + 1) / 2);
    if (ncclCommDestroy(comms[r]) != ncclSuccess) fail(r, "ncclCommDestroy", ncclInvalidUsage);
  }
  return 0;
}

int main(void) {
  int version = 0;
  /* The version of the nccl.h it was built against, weft's own patch level aside. */
  if (ncclGetVersion(&version) != ncclSuccess || version / 100 != NCCL_VERSION_CODE / 100) {
    fprintf(stderr, "ncclGetVersion: %d, expected %d.%d.x (nccl.h)\n", version, NCCL_MAJOR,
            NCCL_MINOR);
    return 1;
  }
  if (strcmp(ncclGetErrorString(ncclInvalidUsage), "") == 0) return 1;
  if (runRanks(rankMain) != 0 || runRanks(nonBlockingRank) != 0 || initAll() != 0 ||
      abortStuck() != 0)
    return 1;
  if (gFailures != 0) {
    fprintf(stderr, "%d check(s) failed\n", gFailures);
    return 1;
  }
  printf("libnccl.so.2 (weft) version %d: every check passed\n", version);
  return 0;
}
