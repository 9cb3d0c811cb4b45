// The memory operations between ranks' kernels and the waits built on them: every load, store
// and fence states its ordering and scope. Scope: the GPU where every rank shares one device
// (LaunchArgs::deviceScope), else the system (peers may be other GPUs or the host). A wait gives
// up when the communicator is aborted or its timeout passes, recording why in KernelError.
#pragma once

#include <cstdint>

#include "src/device/schedule_kernel.hpp"

namespace weft::device {

using algo::Buf;
using algo::Protocol;
using algo::Span;
using algo::Step;
using algo::StepKind;

// ---- memory operations between ranks -------------------------------------------------------
// At device scope where every rank shares this GPU (LaunchArgs::deviceScope), else at system
// scope: peers may be other GPUs. WEFT_GPU_SYSTEM_SCOPE=1 at compile time keeps system scope
// everywhere (to measure the difference: scripts/gpu-ab.sh B_FLAGS=-DWEFT_GPU_SYSTEM_SCOPE=1).
#if defined(WEFT_GPU_SYSTEM_SCOPE)
__device__ __forceinline__ bool gpuScope(const LaunchArgs&) {
  return false;
}
#else
__device__ __forceinline__ bool gpuScope(const LaunchArgs& a) {
  return a.deviceScope != 0;
}
#endif

// Acquire load at the call's scope: what the writer did before its release store is visible
// after it (a peer's flag, then its data).
__device__ __forceinline__ std::uint64_t loadAcquire(const LaunchArgs& a, const std::uint64_t* p) {
  std::uint64_t v;
  if (gpuScope(a)) {
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  } else {
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  }
  return v;
}
// Release store at the call's scope: this thread's earlier writes (and, after a block barrier,
// the block's: PTX release is cumulative) are visible to an acquire load that sees the value.
__device__ __forceinline__ void storeRelease(const LaunchArgs& a, std::uint64_t* p,
                                             std::uint64_t v) {
  if (gpuScope(a)) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  } else {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  }
}
// A full fence at the call's scope (sequentially consistent among fences of that scope).
__device__ __forceinline__ void fence(const LaunchArgs& a) {
  if (gpuScope(a)) {
    __threadfence();
  } else {
    __threadfence_system();
  }
}
// Relaxed load at system scope, never cached in L1 (ll lines: the flag is in the word itself,
// so no ordering is needed beyond the word's own atomicity).
__device__ __forceinline__ std::uint64_t loadVolatile(const std::uint64_t* p) {
  std::uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// Relaxed store at system scope, one 8-byte word (ll lines: data and flag land together).
__device__ __forceinline__ void storeVolatile(std::uint64_t* p, std::uint64_t v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// The device's nanosecond clock (timeouts), no ordering.
__device__ __forceinline__ std::uint64_t globalTimer() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread's wait: gives up when the communicator is aborted (by any rank's kernel, or by
// the host through its mapped abort word) or when the timeout passes.
class Watch {
 public:
  __device__ explicit Watch(const LaunchArgs& a) : a_(a), start_(globalTimer()) {}
  // 0 to keep waiting; else the KernelError code.
  __device__ int check() {
    if (*reinterpret_cast<volatile std::uint32_t*>(a_.aborts[a_.rank]) != 0) return 2;
    if ((++spins_ & 1023u) == 0) {
      if (a_.hostAbort != nullptr && *a_.hostAbort != 0) return 2;
      if (a_.timeoutNs != 0 && globalTimer() - start_ > a_.timeoutNs) return 1;
    }
    return 0;
  }

 private:
  const LaunchArgs& a_;
  std::uint64_t start_;
  std::uint32_t spins_ = 0;
};

// What a wait saw when it gave up, for the error message.
struct Seen {
  int pass = -1;
  int line = -1;
  std::uint64_t have = 0;
  std::uint64_t want = 0;
};

// Records why the kernel stopped and aborts every rank's kernels.
__device__ inline void fail(const LaunchArgs& a, int code, int channel, int peer, int step,
                            Seen seen = {}) {
  volatile KernelError* e = a.error;
  if (e->code == 0) {
    e->channel = channel;
    e->peer = peer;
    e->step = step;
    e->pass = seen.pass;
    e->line = seen.line;
    e->have = seen.have;
    e->want = seen.want;
    __threadfence_system();
    e->code = code;
  }
  for (int r = 0; r < a.nranks; ++r)
    *reinterpret_cast<volatile std::uint32_t*>(a.aborts[r]) = static_cast<std::uint32_t>(code);
  __threadfence_system();
}

// Vectors each thread keeps in flight per operand in the element-wise loop: 8 x 16 bytes x 512
// threads = 64 KiB per SM; 8 beat 4 by 6-7 % at 128 MB (docs/perf-gpu.md, "eight vectors in
// flight"). An A/B switch: scripts/gpu-ab.sh B_FLAGS=-DWEFT_GPU_UNROLL=4.
#ifndef WEFT_GPU_UNROLL
#define WEFT_GPU_UNROLL 8
#endif

// Two switches for the bulk protocol's post, both off by default since each cost 4-8 % at 128 MB
// (docs/perf-gpu.md, "the bulk post, and which switches lost"); =1 restores the old code for an
// A/B:
//  - WEFT_GPU_POST_FENCE=1: a fence before thread 0's release stores. Without it, the release
//    after the block barrier is cumulative in the PTX memory model, so the block's data writes
//    (and its reads of the slots it frees) are ordered before it all the same.
//  - WEFT_GPU_SIMPLE_POST_BARRIER=1: a block barrier after the simple protocol's post. Nothing
//    of the next step reads what thread 0 advanced before that step's first barrier (the ll
//    protocol's unpacking does, so ll keeps it), and the kernel's end has its own barrier.
#ifndef WEFT_GPU_POST_FENCE
#define WEFT_GPU_POST_FENCE 0
#endif
#ifndef WEFT_GPU_SIMPLE_POST_BARRIER
#define WEFT_GPU_SIMPLE_POST_BARRIER 0
#endif

// Call signatures in the messages (signatureOf, schedule_kernel.hpp): compared unless built with
// WEFT_GPU_SIGNATURES=0, which keeps the flags' layout but drops the comparisons and the simple
// slots' signature words (their cost, for an A/B: scripts/gpu-ab.sh
// B_FLAGS=-DWEFT_GPU_SIGNATURES=0; docs/perf.md).
#ifndef WEFT_GPU_SIGNATURES
#define WEFT_GPU_SIGNATURES 1
#endif
constexpr bool kSigned = WEFT_GPU_SIGNATURES != 0;

// Waits until *word >= want; false (with the failure recorded for channel, peer and step) if it
// never gets there.
__device__ inline bool waitAtLeast(const LaunchArgs& a, const std::uint64_t* word,
                                   std::uint64_t want, int channel, int peer, int step,
                                   int pass = -1) {
  Watch w(a);
  std::uint64_t have;
  while ((have = loadAcquire(a, word)) < want) {
    if (int why = w.check(); why != 0) {
      fail(a, why, channel, peer, step, Seen{pass, -1, have, want});
      return false;
    }
  }
  return true;
}

// Waits until a peer's direct flag (directFlag) counts round `call` or a later one; false (with
// the failure recorded) if it never does, or fails with code 3 if it counts this round of a
// call whose signature differs. The counts are compared modulo 2^32: the ranks are within a
// round of each other.
__device__ inline bool waitForCall(const LaunchArgs& a, const std::uint64_t* word,
                                   std::uint64_t call, int channel, int peer) {
  Watch w(a);
  const auto want = static_cast<std::uint32_t>(call);
  for (;;) {
    const std::uint64_t v = loadAcquire(a, word);
    const auto at = static_cast<std::uint32_t>(v >> 32);
    if (static_cast<std::int32_t>(at - want) >= 0) {
      if (!kSigned || at != want || static_cast<std::uint32_t>(v) == a.signature) return true;
      fail(a, 3, channel, peer, 0, Seen{-1, -1, static_cast<std::uint32_t>(v), a.signature});
      return false;
    }
    if (int why = w.check(); why != 0) {
      fail(a, why, channel, peer, 0, Seen{-1, -1, at, want});
      return false;
    }
  }
}

// A barrier of block b across the ranks on word `word` of its flag: once the whole block is done
// with what comes before, thread 0 raises this rank's word to `call` (word 0: directFlag, the
// call's signature beside it); then every thread waits until the word reaches `call` on every
// rank, thread q watching rank q (so the ranks' flags are polled side by side, not one after
// another: at 8 ranks that was 8 round trips a barrier), and at word 0 compares the signature.
// `failed` (shared) is set if some rank never gets there. Ends with the block synchronized.
__device__ inline void barrierEveryRank(const LaunchArgs& a, int b, int word, std::uint64_t call,
                                        int* failed) {
  __syncthreads();
  if (threadIdx.x == 0) {
    fence(a);
    storeRelease(a, a.directFlags[a.rank] + 8 * b + word,
                 word == 0 ? directFlag(call, a.signature) : call);
  }
  for (int q = static_cast<int>(threadIdx.x); q < a.nranks; q += static_cast<int>(blockDim.x)) {
    const std::uint64_t* flag = a.directFlags[q] + 8 * b + word;
    const bool ok =
        word == 0 ? waitForCall(a, flag, call, b, q) : waitAtLeast(a, flag, call, b, q, word);
    if (!ok) *failed = 1;
  }
  __syncthreads();
}

// Every direct kernel's start on block b: unless the communicator is aborted already (then
// recorded, and false), the block's next call count (counts[b] + 1; the slab kernels' counts or
// the ll kernels') in *next (both shared). Ends with the block
// synchronized.
__device__ inline bool directStart(const LaunchArgs& a, int b, const std::uint64_t* counts,
                                   int* failed, std::uint64_t* next) {
  if (threadIdx.x == 0) {
    *failed = *reinterpret_cast<volatile std::uint32_t*>(a.aborts[a.rank]) != 0 ? 1 : 0;
    if (*failed != 0) fail(a, 2, b, -1, -1);
    *next = counts[b] + 1;
  }
  __syncthreads();
  return *failed == 0;
}

}  // namespace weft::device
