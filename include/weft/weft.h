/* weft C ABI. Every function returns a weftResult_t (weftGetLastError() says why a call
 * failed); no exception crosses this boundary. A call that fails on bad input changes nothing. */
#ifndef WEFT_WEFT_H_
#define WEFT_WEFT_H_

#include <stddef.h>
#include <stdint.h>

#include "weft/types.h"

#if defined(__GNUC__)
#define WEFT_API __attribute__((visibility("default")))
#else
#define WEFT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define WEFT_VERSION_MAJOR 0
#define WEFT_VERSION_MINOR 1
#define WEFT_VERSION_PATCH 0
#define WEFT_VERSION_CODE \
  (WEFT_VERSION_MAJOR * 10000 + WEFT_VERSION_MINOR * 100 + WEFT_VERSION_PATCH)

/* The library's version as MAJOR*10000 + MINOR*100 + PATCH. */
WEFT_API weftResult_t weftGetVersion(int* version);

/* A static, human-readable name for a result code ("invalid argument"). Never NULL. */
WEFT_API const char* weftGetErrorString(weftResult_t result);

/* The message of the last failed call on this thread ("" if none). */
WEFT_API const char* weftGetLastError(void);

/* Bytes of one element of the type; 0 for an invalid type. */
WEFT_API size_t weftTypeSize(weftDataType_t type);

/* ---- communicators ----------------------------------------------------------------------- */

/* What ranks share to find each other: the root's address and port and a random secret. Make
 * it on one rank with weftGetUniqueId and hand it to the others (MPI_Bcast, a file, ...). */
#define WEFT_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[WEFT_UNIQUE_ID_BYTES];
} weftUniqueId;

typedef struct weftComm* weftComm_t;

/* Makes an id and starts, in this process, the listener the ranks rendezvous at. With
 * WEFT_COMM_ID=host:port set, the id names that address instead and rank 0 listens there. */
WEFT_API weftResult_t weftGetUniqueId(weftUniqueId* uniqueId);

/* Joins communicator `uniqueId` as `rank` of `nranks`. Blocks until every rank has joined (or
 * WEFT_TIMEOUT_S passes). */
WEFT_API weftResult_t weftCommInitRank(weftComm_t* comm, int nranks, weftUniqueId uniqueId,
                                       int rank);

/* Creates all `nranks` ranks of a communicator in this process, comms[i] being rank i. Each
 * rank's calls must then come from its own thread (collectives block until all ranks call). */
WEFT_API weftResult_t weftCommInitAll(weftComm_t* comms, int nranks);

/* Collective over `comm`: ranks passing the same color get a new communicator together, ranked
 * by key (ties by their rank in `comm`). Color WEFT_SPLIT_NOCOLOR takes part and gets NULL. */
#define WEFT_SPLIT_NOCOLOR (-1)
/* The most ranks a communicator may have (weftCommInitRank, weftCommInitAll): more is
 * weftInvalidArgument. */
#define WEFT_MAX_RANKS 65536
WEFT_API weftResult_t weftCommSplit(weftComm_t comm, int color, int key, weftComm_t* newcomm);

/* Waits until no call is in flight on the communicator, then frees it: a call on another thread
 * finishes first (one stuck on a dead peer ends at WEFT_TIMEOUT_S, or at once after
 * weftCommAbort); calls that begin after the destroy did return weftInvalidArgument. Any rank may
 * destroy at any time after its last call; an aborted communicator is destroyed the same way. */
WEFT_API weftResult_t weftCommDestroy(weftComm_t comm);

/* From any thread: ends every current and later call on every rank of the communicator with an
 * error. The communicator must still be destroyed. */
WEFT_API weftResult_t weftCommAbort(weftComm_t comm);

WEFT_API weftResult_t weftCommCount(weftComm_t comm, int* count);
WEFT_API weftResult_t weftCommUserRank(weftComm_t comm, int* rank);
/* The CUDA device the communicator's GPU transport uses; -1 before its first call with GPU
 * buffers. */
WEFT_API weftResult_t weftCommDevice(weftComm_t comm, int* device);
/* The error that stopped a GPU call of the communicator after it was enqueued (a peer that
 * never answered within WEFT_TIMEOUT_S: weftTimeout; an abort anywhere: weftRemoteError), or
 * weftSuccess. weftGetLastError() then says which channel, step and peer. */
WEFT_API weftResult_t weftCommGetAsyncError(weftComm_t comm, weftResult_t* asyncError);
/* One line describing the communicator: ranks, memory, transport, channels (and, once a call
 * has used GPU buffers, the GPU transport). Valid until the next call of this function on the
 * communicator or its destruction. */
WEFT_API const char* weftCommSummary(weftComm_t comm);

/* What the tuner picks for a call of `coll` with `count` elements of `datatype` (counts as the
 * collective's own call takes them; for weftCollSendRecv and weftCollAllToAllv the total bytes
 * a rank sends, as count of weftUint8): "algorithm/protocol" ("ring/simple"), written with its
 * terminating NUL into `buf` of `len` bytes (truncated to fit). Plans once per size, as a call
 * would; makes no communication. */
WEFT_API weftResult_t weftCommPlan(weftComm_t comm, weftCollective_t coll, size_t count,
                                   weftDataType_t datatype, char* buf, size_t len);
/* Where a call's buffers are, for weftCommPlanMemory. */
typedef enum {
  weftHostMemory = 0,
  weftGpuMemory = 1,
  weftMemoryForceInt = 0x7fffffff /* the range of an int: any value a caller passes is valid */
} weftMemory_t;
/* weftCommPlan for a call on `memory`: GPU buffers are planned by the GPU tuner (another cost
 * model), so their pick may differ from host buffers'. Makes no communication. */
WEFT_API weftResult_t weftCommPlanMemory(weftComm_t comm, weftCollective_t coll, size_t count,
                                         weftDataType_t datatype, weftMemory_t memory, char* buf,
                                         size_t len);

/* ---- collectives -------------------------------------------------------------------------- *
 * Host buffers: the call blocks until this rank's part is done; `stream` must be NULL.
 * GPU buffers (device or managed memory, on every rank): the call enqueues the collective on
 * `stream` (a cudaStream_t; NULL is the default stream) and returns; it is ordered with the
 * stream's other work and can be captured into a CUDA graph. The first GPU call of a
 * communicator sets up its GPU transport (collective over the ranks; keep it outside a graph
 * capture, as each size's first call, which copies its schedule to the device). Failures after
 * enqueueing are reported by weftCommGetAsyncError.
 * Counts are in elements: all-gather's `sendcount` is what each rank contributes,
 * reduce-scatter's `recvcount` what each receives, all-to-all's `count` what goes to each peer.
 * In place: recvbuff == sendbuff (all-gather: sendbuff == recvbuff + rank * sendcount;
 * reduce-scatter: recvbuff == sendbuff + rank * recvcount). */
WEFT_API weftResult_t weftAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                                    void* stream);
WEFT_API weftResult_t weftAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                    weftDataType_t datatype, weftComm_t comm, void* stream);
WEFT_API weftResult_t weftReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                        weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                                        void* stream);
WEFT_API weftResult_t weftBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                    weftDataType_t datatype, int root, weftComm_t comm,
                                    void* stream);
WEFT_API weftResult_t weftReduce(const void* sendbuff, void* recvbuff, size_t count,
                                 weftDataType_t datatype, weftRedOp_t op, int root, weftComm_t comm,
                                 void* stream);
WEFT_API weftResult_t weftAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                                   weftDataType_t datatype, weftComm_t comm, void* stream);
/* Point-to-point, on host or GPU buffers (GPU: enqueued on `stream`, every send and receive of
 * a group on one stream and one kind of memory). A rank may send to itself inside a group
 * that also holds the matching receive (the k-th send to itself meets the k-th receive from itself,
 * of the same size). */
WEFT_API weftResult_t weftSend(const void* sendbuff, size_t count, weftDataType_t datatype,
                               int peer, weftComm_t comm, void* stream);
WEFT_API weftResult_t weftRecv(void* recvbuff, size_t count, weftDataType_t datatype, int peer,
                               weftComm_t comm, void* stream);
WEFT_API weftResult_t weftBarrier(weftComm_t comm, void* stream);

/* Registered buffers, as NCCL's local registration: `size` bytes at `buff` (GPU memory) that
 * collectives of `comm` may read in place on the peers, without copying them first. Local calls
 * (no communication); the ranks' buffers are exchanged at the first collective that passes a
 * registered buffer, outside graph capture (a captured call before that copies as usual). As
 * with NCCL, when one rank passes a registered buffer every rank must, at the same offset from
 * its registered buffer's start; otherwise the call fails with an error after WEFT_TIMEOUT_S (it
 * looks like a stuck peer). Where some rank's buffer cannot be read in place (not GPU memory,
 * or, across processes, an allocation CUDA IPC cannot export: a stream-ordered pool's, a VMM
 * one's), every rank learns it at the exchange and its calls copy as usual. Today the direct
 * all-reduce kernels (one-shot and two-shot, out of place, up to their limit: 4 MiB on an H200)
 * read registered inputs in place; every other call treats a registered buffer as any other.
 * weftCommDeregister waits for the communicator's enqueued GPU work, then forgets the buffer;
 * weftCommDestroy deregisters what is left. */
WEFT_API weftResult_t weftCommRegister(weftComm_t comm, void* buff, size_t size, void** handle);
WEFT_API weftResult_t weftCommDeregister(weftComm_t comm, void* handle);

/* Host memory that the other processes of a communicator on this host can read in place: `size`
 * bytes (page-aligned, zeroed), each allocation a shared memory file of its own. When the ranks
 * are processes of one host, a call takes the direct path and every rank's buffers of that call
 * lie in such memory, each rank loads what it needs from its peers' buffers instead of copying
 * them through its stage (the peers' allocations are mapped read-only at their first use,
 * through /proc: the permission process_vm_readv needs). For every other call it is host memory
 * like any other. weftHostFree(NULL) does nothing; it refuses
 * any other pointer weftHostAlloc did not return; a peer's mapping outlives the free until its
 * communicator goes. */
WEFT_API weftResult_t weftHostAlloc(void** ptr, size_t size);
WEFT_API weftResult_t weftHostFree(void* ptr);

/* All-to-all with a count and a displacement (both in elements) per peer, as MPI_Alltoallv.
 * sendcounts[q] on this rank must equal recvcounts[this rank] on rank q. */
WEFT_API weftResult_t weftAllToAllv(const void* sendbuff, const size_t sendcounts[],
                                    const size_t sdispls[], void* recvbuff,
                                    const size_t recvcounts[], const size_t rdispls[],
                                    weftDataType_t datatype, weftComm_t comm, void* stream);

/* Groups, as NCCL's: calls between weftGroupStart and weftGroupEnd on this thread are queued
 * (their arguments checked when queued) and run at weftGroupEnd: each communicator's sends and
 * receives all progress together (so a rank may send to and receive from the same peer, of any
 * size), then its collectives in call order; several communicators (weftCommInitAll's ranks,
 * driven from one thread) run concurrently. Groups nest; the outermost end runs them. */
WEFT_API weftResult_t weftGroupStart(void);
WEFT_API weftResult_t weftGroupEnd(void);

/* ---- compressed collectives ------------------------------------------------------------- *
 * All-reduce, reduce-scatter and all-gather whose values cross between ranks as fp8 with one
 * scale per block (docs/algorithms-fused.md, "Compressed collectives"): bf16, f16 or f32 values;
 * sum and avg; every sum taken in f32, each value quantized at most twice (its input, then its
 * sum), every rank getting the same bits. The error bound is in docs/api.md. A compressed call
 * changes results, so nothing compresses unless asked: per call, or by the communicator's
 * default (weftCommSetCompression, WEFT_COMPRESS). */
typedef enum {
  weftCompressNone = 0, /* the values cross as they are */
  weftCompressFp8E4M3 = 1,
  weftCompressFp8E5M2 = 2,
  weftNumCompressFormats = 3,
  weftCompressForceInt = 0x7fffffff /* the range of an int: any value a caller passes is valid */
} weftCompressFormat_t;
typedef enum {
  weftScaleE8M0 = 0,
  weftScaleF32 = 1,
  weftNumScaleKinds = 2,
  weftScaleForceInt = 0x7fffffff
} weftScaleKind_t;
typedef struct {
  weftCompressFormat_t format;
  /* weftScaleE8M0 (a power of two) with blocks of 32 values, as OCP MX; weftScaleF32 with 128. */
  weftScaleKind_t scale;
  int block;
  /* 0: the selector compresses where that is cheaper than the call as it is (the same pick on
   * every rank); 1: every call it can. */
  int always;
} weftCompression;

/* "fp8e4m3:32", "e5m2:128", either with ":always"; "none" or "" for no compression. */
WEFT_API weftResult_t weftCompressionParse(const char* text, weftCompression* compression);
/* The compression the Ex calls use when given NULL: `compression` (NULL: none). Local; every
 * rank must set the same. WEFT_COMPRESS sets it at init. */
WEFT_API weftResult_t weftCommSetCompression(weftComm_t comm, const weftCompression* compression);
WEFT_API weftResult_t weftCommGetCompression(weftComm_t comm, weftCompression* compression);
/* weftAllReduce, weftReduceScatter and weftAllGather that may cross compressed: `compression`
 * NULL takes the communicator's default. A compression that cannot serve the call (another
 * type or op) is weftInvalidArgument when passed, and the call as it is when it is the default. */
WEFT_API weftResult_t weftAllReduceEx(const void* sendbuff, void* recvbuff, size_t count,
                                      weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                                      void* stream, const weftCompression* compression);
WEFT_API weftResult_t weftReduceScatterEx(const void* sendbuff, void* recvbuff, size_t recvcount,
                                          weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                                          void* stream, const weftCompression* compression);
WEFT_API weftResult_t weftAllGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount,
                                      weftDataType_t datatype, weftComm_t comm, void* stream,
                                      const weftCompression* compression);
/* weftCommPlanMemory for an Ex call: "compressed e4m3:32/simple" where it would compress. */
WEFT_API weftResult_t weftCommPlanEx(weftComm_t comm, weftCollective_t coll, size_t count,
                                     weftDataType_t datatype, weftMemory_t memory,
                                     const weftCompression* compression, char* buf, size_t len);

/* ---- tensor-parallel GEMMs with their collective ---------------------------------------- *
 * On GPU memory, enqueued on `stream`, capturable in a CUDA graph (docs/algorithms-fused.md,
 * "Tensor-parallel overlap"). Row-major bf16, f16 or f32 matrices, f32 accumulation (cuBLASLt,
 * loaded at the first call); m, n, k are the whole GEMM's, with s ranks:
 *   weftAllGatherGemm:     C [m, n/s] = allgather(A [m/s, k]) * B [k, n/s] (+ bias [n/s]);
 *                          aGathered (or NULL) gets the gathered A [m, k] as well.
 *   weftGemmReduceScatter: C [m/s, n] = reducescatter(A [m, k/s] * B [k/s, n]) (+ bias [n]).
 * The selector runs each unfused or in chunks whose collective overlaps the next chunk's GEMM
 * (WEFT_TP_OVERLAP forces one). `workspace`: weftTpWorkspaceSize bytes of device memory, or
 * NULL (and 0) for the communicator's own. Shapes that do not divide among the ranks, another
 * type or too small a workspace are weftInvalidArgument and change nothing. */
typedef enum {
  weftTpAllGatherGemm = 0,
  weftTpGemmReduceScatter = 1,
  weftNumTpOps = 2,
  weftTpOpForceInt = 0x7fffffff
} weftTpOp_t;
WEFT_API weftResult_t weftAllGatherGemm(const void* aShard, const void* b, void* c, void* aGathered,
                                        const void* bias, size_t m, size_t n, size_t k,
                                        weftDataType_t datatype, void* workspace,
                                        size_t workspaceBytes, weftComm_t comm, void* stream);
WEFT_API weftResult_t weftGemmReduceScatter(const void* a, const void* b, void* c, const void* bias,
                                            size_t m, size_t n, size_t k, weftDataType_t datatype,
                                            void* workspace, size_t workspaceBytes, weftComm_t comm,
                                            void* stream);
/* The fp8 forms: A and B of `datatype` weftFloat8e4m3, B given transposed (row-major B^T,
 * [n/s, k] for all-gather and [n, k/s] for reduce-scatter: fp8 tensor cores read both operands
 * along k); C and the bias of fp8->output (weftBfloat16 or weftFloat16), C = (A * B) scaled,
 * (+ bias). `scaling`:
 *   weftTpFp8PerTensor: aScale and bScale one float each in device memory, NULL for 1;
 *     all-gather's aScale the same on every rank.
 *   weftTpFp8Block128 (DeepSeek-V3's): aScale one float per 128 values along k of each row of
 *     this rank's A, row-major [rows, ceil(kr / 128)]; bScale one per 128 x 128 tile of this
 *     rank's B^T, row-major [ceil(nr / 128), ceil(kr / 128)]; rows, kr, nr = m/s, k, n/s for
 *     all-gather and m, k/s, n for reduce-scatter. All-gather gathers the scales with A, and
 *     puts them in aScaleGathered ([m, ceil(k / 128)]) where that is not NULL.
 * cuBLASLt's fp8 rules: A, B, C, aGathered, the bias and the scales at 16-byte aligned
 * addresses, a rank's k (k, or k/s for reduce-scatter) a multiple of 16, C's rows (n/s or n
 * values) a multiple of 8. weftTpWorkspaceSize and weftTpPlan take weftFloat8e4m3 for these calls.
 * An initializer that stops after bScale means per-tensor scales. */
typedef enum {
  weftTpFp8PerTensor = 0,
  weftTpFp8Block128 = 1,
  weftTpFp8ScalingForceInt = 0x7fffffff
} weftTpFp8Scaling_t;
typedef struct {
  weftDataType_t output;
  const float* aScale;
  const float* bScale;
  weftTpFp8Scaling_t scaling;
  float* aScaleGathered;
} weftTpFp8;
WEFT_API weftResult_t weftAllGatherGemmFp8(const void* aShard, const void* bT, void* c,
                                           void* aGathered, const void* bias, size_t m, size_t n,
                                           size_t k, weftDataType_t datatype, const weftTpFp8* fp8,
                                           void* workspace, size_t workspaceBytes, weftComm_t comm,
                                           void* stream);
WEFT_API weftResult_t weftGemmReduceScatterFp8(const void* a, const void* bT, void* c,
                                               const void* bias, size_t m, size_t n, size_t k,
                                               weftDataType_t datatype, const weftTpFp8* fp8,
                                               void* workspace, size_t workspaceBytes,
                                               weftComm_t comm, void* stream);
/* The workspace such a call needs (the same whatever the selector picks). */
WEFT_API weftResult_t weftTpWorkspaceSize(weftComm_t comm, weftTpOp_t op, size_t m, size_t n,
                                          size_t k, weftDataType_t datatype, size_t* bytes);
/* How such a call would run ("chunked:4", "unfused"), the same on every rank. */
WEFT_API weftResult_t weftTpPlan(weftComm_t comm, weftTpOp_t op, size_t m, size_t n, size_t k,
                                 weftDataType_t datatype, char* buf, size_t len);

/* ---- context-parallel (ring) attention ---------------------------------------------------- *
 * Each rank holds its zigzag shard of every sequence (weftZigzagLocal): of a sequence of L
 * tokens cut into 2s chunks, chunk r and chunk 2s - 1 - r, L a multiple of 2s. Packed sequences
 * (flash-attention's varlen layout) on GPU memory: q [tokens, heads, headDim], k and v [tokens,
 * kvHeads, headDim] of `datatype` (bf16 or f16), headDim 64 or 128, heads a multiple of kvHeads;
 * cuSeqlens: sequences + 1 offsets into this rank's tokens (device memory); out [tokens, heads,
 * headDim] and lse [heads, tokens] (f32, natural log). The K/V blocks travel around the ring
 * while each rank attends its queries to the block it holds (docs/algorithms-fused.md, "Ring
 * attention"). softmaxScale 0 means 1/sqrt(headDim). */
typedef struct {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  const int32_t* cuSeqlens;
  int sequences;
  size_t tokens;
  size_t maxSeqlen; /* the longest sequence's tokens on this rank */
  int heads;
  int kvHeads;
  int headDim;
  weftDataType_t datatype;
  int causal;
  float softmaxScale;
} weftAttention;
/* `workspace`: weftRingAttentionWorkspaceSize bytes of device memory, or NULL (and 0) for the
 * communicator's own. */
WEFT_API weftResult_t weftRingAttention(const weftAttention* attention, void* workspace,
                                        size_t workspaceBytes, weftComm_t comm, void* stream);
WEFT_API weftResult_t weftRingAttentionWorkspaceSize(const weftAttention* attention,
                                                     weftComm_t comm, size_t* bytes);
/* The backward pass, from the forward's call (its out and lse, as the forward wrote them) and
 * the loss's gradient by out: the gradients of q, k and v (of `datatype`, q's and k's shapes,
 * device memory, 16-byte aligned). The K/V blocks go around the ring again with their
 * gradients, in f32, and come home; dq stays on its rank. */
typedef struct {
  const void* dOut;
  void* dq;
  void* dk;
  void* dv;
} weftAttentionGrads;
WEFT_API weftResult_t weftRingAttentionBackward(const weftAttention* attention,
                                                const weftAttentionGrads* grads, void* workspace,
                                                size_t workspaceBytes, weftComm_t comm,
                                                void* stream);
WEFT_API weftResult_t weftRingAttentionBackwardWorkspaceSize(const weftAttention* attention,
                                                             weftComm_t comm, size_t* bytes);
/* Rank `rank` of `nranks`'s share of packed sequences (host memory): its offsets localCuSeqlens
 * (sequences + 1) and, where positions is not NULL, each local token's position in its sequence
 * (what RoPE needs). A sequence whose length 2 * nranks does not divide is weftInvalidArgument. */
WEFT_API weftResult_t weftZigzagLocal(const int32_t* cuSeqlens, int sequences, int nranks, int rank,
                                      int32_t* localCuSeqlens, int32_t* positions);

/* Mixture-of-experts dispatch and combine (expert parallelism), on host memory (stream NULL) or
 * GPU memory (where recvX is; then every buffer is, the calls run on `stream`, nothing waits on
 * the host inside a CUDA graph capture, and a shape's first call must come outside one; the ranks
 * must map each other's memory: one host). The experts split evenly over the ranks in order: rank r
 * holds experts r * E/n ... (r + 1) * E/n - 1. Collective: every rank calls it with the same
 * hidden, topk, experts and datatype, `tokens` its own. Each token's row goes once to each rank
 * that holds one of its experts; recvX receives the rows grouped by local expert (each expert's by
 * source rank, then the source's token order), expertCounts each local expert's rows. A routing
 * error on any rank (an expert out of range, one listed twice), or more rows for a rank than its
 * capacity, is every rank's error, saying which and by how many; nothing is written. The handle
 * is the layout combine needs (docs/algorithms-fused.md, "MoE dispatch and combine"). */
typedef struct {
  const void* x;            /* [tokens, hidden] of datatype (bf16, f16 or f32) */
  const int64_t* topkIdx;   /* [tokens, topk]: an expert, or -1 (dropped) */
  const float* topkWeights; /* [tokens, topk]: combine's weights */
  size_t tokens;
  size_t hidden;
  int topk;
  int experts; /* over every rank */
  weftDataType_t datatype;
  void* recvX; /* [capacity, hidden] of datatype */
  size_t capacity;
  int32_t* expertCounts; /* [experts / nranks] */
  int32_t* recvSource;   /* NULL, or [capacity, 2]: each row's source rank and token */
  /* 1: rows travel and arrive as fp8 e4m3 with one f32 scale per 128 values (a value is about
   * element * scale): recvX [capacity, hidden] bytes, recvScales [capacity, ceil(hidden / 128)];
   * combine stays in datatype; on GPU memory hidden must be a multiple of 128. 0: rows of
   * datatype. */
  int fp8Dispatch;
  float* recvScales;
} weftMoeDispatchArgs;
typedef struct weftMoeHandle* weftMoeHandle_t;
WEFT_API weftResult_t weftMoeDispatch(const weftMoeDispatchArgs* args, weftMoeHandle_t* handle,
                                      weftComm_t comm, void* stream);
/* The rows dispatch wrote to recvX (and combine reads from expertOut). */
WEFT_API weftResult_t weftMoeRows(weftMoeHandle_t handle, size_t* rows);
/* Collective: out [tokens, hidden] = each token's sum over its slots of weight * the expert's
 * output row (expertOut [rows, hidden], laid out as recvX was), in f32, summed in rank order,
 * so the same bits whatever the arrival order; 0 where every slot was dropped. */
WEFT_API weftResult_t weftMoeCombine(weftMoeHandle_t handle, const void* expertOut, void* out,
                                     weftComm_t comm, void* stream);
/* The same calls in halves, so that work the caller puts on `stream` between a send and its
 * receive overlaps the rows' flight (GPU memory; on host memory the dispatch happens in its send
 * and the combine in its receive). weftMoeDispatch is weftMoeDispatchSend then
 * weftMoeDispatchRecv, weftMoeCombine weftMoeCombineSend then weftMoeCombineRecv; the halves come
 * in that order (another order is weftInvalidUsage), and weftMoeRows is known after
 * weftMoeDispatchRecv outside a capture. */
WEFT_API weftResult_t weftMoeDispatchSend(const weftMoeDispatchArgs* args, weftMoeHandle_t* handle,
                                          weftComm_t comm, void* stream);
WEFT_API weftResult_t weftMoeDispatchRecv(weftMoeHandle_t handle, weftComm_t comm, void* stream);
WEFT_API weftResult_t weftMoeCombineSend(weftMoeHandle_t handle, const void* expertOut,
                                         weftComm_t comm, void* stream);
WEFT_API weftResult_t weftMoeCombineRecv(weftMoeHandle_t handle, void* out, weftComm_t comm,
                                         void* stream);
WEFT_API weftResult_t weftMoeHandleDestroy(weftMoeHandle_t handle);

#ifdef __cplusplus
}
#endif

#endif /* WEFT_WEFT_H_ */
