/* The NCCL interface on GPU memory, as a C program built against nccl.h would use it: ranks
 * as threads, rank r on GPU r mod the GPU count (on one GPU they share it, which weft allows),
 * device buffers and a stream each. All-reduce, all-gather, reduce-scatter, broadcast, send and
 * receive around a ring in a group, and an all-reduce captured into a CUDA graph and replayed,
 * each checked exactly (small integers in float). Exit 0 when every check holds, 77 (skipped)
 * without a GPU. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define NRANKS 4
#define COUNT 65537

static ncclUniqueId gId;
static int gDevices = 1;
static int gFailures = 0;
static pthread_mutex_t gLock = PTHREAD_MUTEX_INITIALIZER;

static void fail(int rank, const char* what, const char* why) {
  pthread_mutex_lock(&gLock);
  fprintf(stderr, "rank %d: %s: %s\n", rank, what, why);
  ++gFailures;
  pthread_mutex_unlock(&gLock);
}

#define NCCL(rank, call)                         \
  do {                                           \
    ncclResult_t r_ = (call);                    \
    if (r_ != ncclSuccess) {                     \
      fail(rank, #call, ncclGetLastError(NULL)); \
      return NULL;                               \
    }                                            \
  } while (0)
#define CUDA(rank, call)                         \
  do {                                           \
    cudaError_t e_ = (call);                     \
    if (e_ != cudaSuccess) {                     \
      fail(rank, #call, cudaGetErrorString(e_)); \
      return NULL;                               \
    }                                            \
  } while (0)

/* Rank r's input element i: small integers, so every sum is exact in float. */
static float value(int r, int i, int round) {
  return (float)((i * 7 + r * 13 + round) % 101);
}

/* The elements [0, n) of `dev` must equal want(i); returns whether they did. */
static int expectEqual(int rank, const char* what, const float* dev, int n, const float* want) {
  float* got = malloc(sizeof(float) * (size_t)n);
  int ok = got != NULL &&
           cudaMemcpy(got, dev, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost) == cudaSuccess;
  for (int i = 0; ok && i < n; ++i) {
    if (got[i] != want[i]) {
      char why[96];
      snprintf(why, sizeof why, "element %d is %g, expected %g", i, got[i], want[i]);
      fail(rank, what, why);
      ok = 0;
    }
  }
  free(got);
  return ok;
}

static void* rankMain(void* arg) {
  const int rank = (int)(long)arg;
  CUDA(rank, cudaSetDevice(rank % gDevices));
  ncclComm_t comm = NULL;
  NCCL(rank, ncclCommInitRank(&comm, NRANKS, gId, rank));
  cudaStream_t stream;
  CUDA(rank, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t all = (size_t)NRANKS * COUNT;
  float *in = NULL, *out = NULL;
  CUDA(rank, cudaMalloc((void**)&in, all * sizeof(float)));
  CUDA(rank, cudaMalloc((void**)&out, all * sizeof(float)));
  float* host = malloc(all * sizeof(float));
  float* want = malloc(all * sizeof(float));
  if (host == NULL || want == NULL) {
    fail(rank, "malloc", "out of memory");
    return NULL;
  }
  for (int round = 0; round < 3; ++round) {
    /* All-reduce (rounds 0, 1 eager; round 2 through a captured graph, replayed twice). */
    for (size_t i = 0; i < all; ++i) host[i] = value(rank, (int)i, round);
    CUDA(rank, cudaMemcpy(in, host, all * sizeof(float), cudaMemcpyHostToDevice));
    CUDA(rank, cudaMemset(out, 0xA5, all * sizeof(float)));
    CUDA(rank, cudaDeviceSynchronize()); /* the non-blocking stream does not wait for it */
    if (round < 2) {
      NCCL(rank, ncclAllReduce(in, out, COUNT, ncclFloat32, ncclSum, comm, stream));
    } else {
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CUDA(rank, cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      NCCL(rank, ncclAllReduce(in, out, COUNT, ncclFloat32, ncclSum, comm, stream));
      CUDA(rank, cudaStreamEndCapture(stream, &graph));
      CUDA(rank, cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 2; ++replay) CUDA(rank, cudaGraphLaunch(exec, stream));
      CUDA(rank, cudaStreamSynchronize(stream));
      CUDA(rank, cudaGraphExecDestroy(exec));
      CUDA(rank, cudaGraphDestroy(graph));
    }
    CUDA(rank, cudaStreamSynchronize(stream));
    for (int i = 0; i < COUNT; ++i) {
      want[i] = 0;
      for (int q = 0; q < NRANKS; ++q) want[i] += value(q, i, round);
    }
    expectEqual(rank, "ncclAllReduce", out, COUNT, want);
  }
  /* All-gather: rank q's COUNT elements at q * COUNT. */
  NCCL(rank, ncclAllGather(in, out, COUNT, ncclFloat32, comm, stream));
  CUDA(rank, cudaStreamSynchronize(stream));
  for (int q = 0; q < NRANKS; ++q)
    for (int i = 0; i < COUNT; ++i) want[(size_t)q * COUNT + (size_t)i] = value(q, i, 2);
  expectEqual(rank, "ncclAllGather", out, (int)all, want);
  /* Reduce-scatter: piece `rank` of the sum over every rank's NRANKS * COUNT elements. */
  NCCL(rank, ncclReduceScatter(in, out, COUNT, ncclFloat32, ncclSum, comm, stream));
  CUDA(rank, cudaStreamSynchronize(stream));
  for (int i = 0; i < COUNT; ++i) {
    want[i] = 0;
    for (int q = 0; q < NRANKS; ++q) want[i] += value(q, rank * COUNT + i, 2);
  }
  expectEqual(rank, "ncclReduceScatter", out, COUNT, want);
  /* Broadcast from rank 1. */
  NCCL(rank, ncclBroadcast(in, out, COUNT, ncclFloat32, 1, comm, stream));
  CUDA(rank, cudaStreamSynchronize(stream));
  for (int i = 0; i < COUNT; ++i) want[i] = value(1, i, 2);
  expectEqual(rank, "ncclBroadcast", out, COUNT, want);
  /* Around the ring: send to the next rank, receive from the one before, in one group. */
  NCCL(rank, ncclGroupStart());
  NCCL(rank, ncclSend(in, COUNT, ncclFloat32, (rank + 1) % NRANKS, comm, stream));
  NCCL(rank, ncclRecv(out, COUNT, ncclFloat32, (rank + NRANKS - 1) % NRANKS, comm, stream));
  NCCL(rank, ncclGroupEnd());
  CUDA(rank, cudaStreamSynchronize(stream));
  for (int i = 0; i < COUNT; ++i) want[i] = value((rank + NRANKS - 1) % NRANKS, i, 2);
  expectEqual(rank, "ncclSend/ncclRecv", out, COUNT, want);
  ncclResult_t async = ncclSuccess;
  NCCL(rank, ncclCommGetAsyncError(comm, &async));
  if (async != ncclSuccess) fail(rank, "ncclCommGetAsyncError", ncclGetErrorString(async));
  NCCL(rank, ncclCommDestroy(comm));
  CUDA(rank, cudaFree(in));
  CUDA(rank, cudaFree(out));
  CUDA(rank, cudaStreamDestroy(stream));
  free(host);
  free(want);
  return NULL;
}

int main(void) {
  /* Ranks as threads sharing a GPU want a hardware queue each (docs/configuration.md). */
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  if (cudaGetDeviceCount(&gDevices) != cudaSuccess || gDevices < 1) {
    printf("no GPU: skipped\n");
    return 77;
  }
  if (ncclGetUniqueId(&gId) != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  pthread_t threads[NRANKS];
  for (long r = 0; r < NRANKS; ++r) pthread_create(&threads[r], NULL, rankMain, (void*)r);
  for (int r = 0; r < NRANKS; ++r) pthread_join(threads[r], NULL);
  if (gFailures != 0) {
    fprintf(stderr, "%d check(s) failed\n", gFailures);
    return 1;
  }
  printf("weft's libnccl.so.2 on %d GPU(s), %d ranks: every check passed\n", gDevices, NRANKS);
  return 0;
}
