#include "src/device/schedule_kernel.hpp"

#include <algorithm>
#include <string>

#include "src/device/arith.cuh"

namespace weft::device {
namespace {

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

__device__ __forceinline__ std::uint64_t loadAcquire(const LaunchArgs& a, const std::uint64_t* p) {
  std::uint64_t v;
  if (gpuScope(a)) {
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  } else {
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  }
  return v;
}
__device__ __forceinline__ void storeRelease(const LaunchArgs& a, std::uint64_t* p,
                                             std::uint64_t v) {
  if (gpuScope(a)) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  } else {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  }
}
__device__ __forceinline__ void fence(const LaunchArgs& a) {
  if (gpuScope(a)) {
    __threadfence();
  } else {
    __threadfence_system();
  }
}
__device__ __forceinline__ std::uint64_t loadVolatile(const std::uint64_t* p) {
  std::uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void storeVolatile(std::uint64_t* p, std::uint64_t v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
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
__device__ void fail(const LaunchArgs& a, int code, int channel, int peer, int step,
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
// threads = 64 KiB per SM (one block per SM: the kernel takes ~100-128 registers). 8 against 4
// on the H200, 128 MB all-reduce under MPS: 4 ranks 224 -> 237 GB/s busbw, 8 ranks 110 -> 118
// (docs/perf.md, 2026-11-30b). An A/B switch: scripts/gpu-ab.sh B_FLAGS=-DWEFT_GPU_UNROLL=4.
#ifndef WEFT_GPU_UNROLL
#define WEFT_GPU_UNROLL 8
#endif

// Two switches for the bulk protocol's post, both off by default since measured (docs/perf.md,
// 2026-11-30c: each alone took 8 ranks' 128 MB all-reduce from 117 to 122-126 GB/s busbw on the
// H200 under MPS; =1 restores the old code for an A/B):
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

// ---- element-wise work of the whole block ------------------------------------------------

// Waits until *word >= want; false (with the failure recorded for channel, peer and step) if it
// never gets there.
__device__ bool waitAtLeast(const LaunchArgs& a, const std::uint64_t* word, std::uint64_t want,
                            int channel, int peer, int step, int pass = -1) {
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
__device__ bool waitForCall(const LaunchArgs& a, const std::uint64_t* word, std::uint64_t call,
                            int channel, int peer) {
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

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

// Loads a message word written by a peer: through L2, never a stale L1 line from the slot's
// previous use.
__device__ __forceinline__ uint4 loadShared(const uint4* p, bool fromPeer) {
  return fromPeer ? __ldcg(p) : *p;
}

template <int Bytes>
struct BitsOf;
template <>
struct BitsOf<1> {
  using type = std::uint8_t;
};
template <>
struct BitsOf<2> {
  using type = std::uint16_t;
};
template <>
struct BitsOf<4> {
  using type = std::uint32_t;
};
template <>
struct BitsOf<8> {
  using type = std::uint64_t;
};

// One element; from a peer's slot through a volatile load (not a stale L1 line).
template <typename T>
__device__ __forceinline__ T loadElem(const T* p, bool fromPeer) {
  if (!fromPeer) return *p;
  using U = typename BitsOf<sizeof(T)>::type;
  const U u = *reinterpret_cast<const volatile U*>(p);
  T t;
  memcpy(&t, &u, sizeof t);
  return t;
}

template <typename T, typename Op>
__device__ __forceinline__ uint4 combineVec(uint4 x, uint4 y) {
  constexpr int kPerVec = sizeof(uint4) / sizeof(T);
  uint4 r;
  const T* ex = reinterpret_cast<const T*>(&x);
  const T* ey = reinterpret_cast<const T*>(&y);
  T* er = reinterpret_cast<T*>(&r);
#pragma unroll
  for (int k = 0; k < kPerVec; ++k) er[k] = combine<T, Op>(ex[k], ey[k]);
  return r;
}

// outs[o][i] = ins[0][i] (op) ins[1][i] (op) ... for i < n, every out the same. ins[k] for
// k >= firstPeer are slots peers wrote. Each thread handles the same elements in every operand,
// so an out may alias an in.
template <typename T, typename Op>
__device__ void elementwise(T* const* outs, int nouts, const T* const* ins, int nins, int firstPeer,
                            std::size_t n) {
  if (n == 0 || nouts == 0) return;
  constexpr std::size_t kPerVec = sizeof(uint4) / sizeof(T);
  constexpr int kUnroll = WEFT_GPU_UNROLL;
  bool vec = true;
  for (int k = 0; k < nins; ++k) vec = vec && aligned16(ins[k]);
  for (int o = 0; o < nouts; ++o) vec = vec && aligned16(outs[o]);
  std::size_t done = 0;
  if (vec) {
    const std::size_t nvec = n / kPerVec;
    const std::size_t step = std::size_t{blockDim.x} * kUnroll;
    const std::size_t whole = nvec / step * step;
    for (std::size_t base = threadIdx.x; base < whole; base += step) {
      uint4 acc[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        acc[u] = loadShared(reinterpret_cast<const uint4*>(ins[0]) + base + u * blockDim.x,
                            firstPeer == 0);
      for (int k = 1; k < nins; ++k) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          v[u] = loadShared(reinterpret_cast<const uint4*>(ins[k]) + base + u * blockDim.x,
                            k >= firstPeer);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) acc[u] = combineVec<T, Op>(acc[u], v[u]);
      }
      for (int o = 0; o < nouts; ++o) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          reinterpret_cast<uint4*>(outs[o])[base + u * blockDim.x] = acc[u];
      }
    }
    for (std::size_t i = whole + threadIdx.x; i < nvec; i += blockDim.x) {
      uint4 acc = loadShared(reinterpret_cast<const uint4*>(ins[0]) + i, firstPeer == 0);
      for (int k = 1; k < nins; ++k)
        acc = combineVec<T, Op>(
            acc, loadShared(reinterpret_cast<const uint4*>(ins[k]) + i, k >= firstPeer));
      for (int o = 0; o < nouts; ++o) reinterpret_cast<uint4*>(outs[o])[i] = acc;
    }
    done = nvec * kPerVec;
  }
  for (std::size_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    T acc = loadElem(ins[0] + i, firstPeer == 0);
    for (int k = 1; k < nins; ++k) acc = combine<T, Op>(acc, loadElem(ins[k] + i, k >= firstPeer));
    for (int o = 0; o < nouts; ++o) outs[o][i] = acc;
  }
}

// Bytes from `from` to `to` by the whole block (16-byte vectors where both allow), loading
// through L2 when a peer wrote them.
__device__ void copyBytes(std::byte* to, const std::byte* from, std::size_t n, bool fromPeer) {
  std::size_t done = 0;
  if (aligned16(to) && aligned16(from)) {
    const std::size_t nvec = n / 16;
    const auto* src = reinterpret_cast<const uint4*>(from);
    auto* dst = reinterpret_cast<uint4*>(to);
    for (std::size_t i = threadIdx.x; i < nvec; i += blockDim.x)
      dst[i] = loadShared(src + i, fromPeer);
    done = nvec * 16;
  }
  for (std::size_t i = done + threadIdx.x; i < n; i += blockDim.x)
    to[i] =
        static_cast<std::byte>(loadElem(reinterpret_cast<const std::uint8_t*>(from) + i, fromPeer));
}

// ---- the interpreter -----------------------------------------------------------------------

__device__ __forceinline__ std::size_t lesser(std::size_t a, std::size_t b) {
  return a < b ? a : b;
}

struct BlockRef {
  Buf buf;
  std::uint32_t block;
};

template <typename T>
struct Piece {
  T* at = nullptr;
  std::size_t elems = 0;
};

// Per-block state in shared memory, sized by the rank count at launch. The counts are the
// block's (thread q loads and stores entry q at the kernel's ends; thread 0 advances them when a
// step posts, between barriers). The message and operand lists are each warp's own: its lane 0
// writes them and the warp reads them after __syncwarp, so no thread reads a list another warp
// may be rewriting (every thread writing the same values into one shared list is a data race,
// which compute-sanitizer racecheck reports).
struct Scratchpad {
  static constexpr int kWarps = kThreads / 32;
  std::uint64_t* sent;      // [nranks] messages posted to each peer
  std::uint64_t* received;  // [nranks] messages consumed from each peer
  int* failed;
  // This thread's warp's lists:
  const std::byte** msgs;  // [nranks] this step's received messages
  std::byte** targets;     // [nranks] where this step's message to each send peer is written
  const void** ins;        // [nranks + 1]
  void** outs;             // [nranks + 2]

  static __host__ __device__ std::size_t perWarp(std::size_t n) { return 8 * (4 * n + 3); }
  static __host__ __device__ std::size_t bytes(int nranks) {
    const auto n = static_cast<std::size_t>(nranks);
    return 16 * n + 16 + kWarps * perWarp(n);
  }
  __device__ static Scratchpad carve(std::byte* base, int nranks) {
    const auto n = static_cast<std::size_t>(nranks);
    Scratchpad s;
    s.sent = reinterpret_cast<std::uint64_t*>(base);
    s.received = reinterpret_cast<std::uint64_t*>(base + 8 * n);
    s.failed = reinterpret_cast<int*>(base + 16 * n);
    std::byte* mine = base + 16 * n + 16 + (threadIdx.x / 32) * perWarp(n);
    s.msgs = reinterpret_cast<const std::byte**>(mine);
    s.targets = reinterpret_cast<std::byte**>(mine + 8 * n);
    s.ins = reinterpret_cast<const void**>(mine + 16 * n);
    s.outs = reinterpret_cast<void**>(mine + 24 * n + 8);
    return s;
  }
};

template <typename T, typename Op, Protocol P>
class Runner {
 public:
  __device__ Runner(const LaunchArgs& a, int channel, std::byte* shared)
      : a_(a),
        channel_(channel),
        code_(a.channels[channel]),
        to_(a.to + static_cast<std::size_t>(channel) * a.nranks),
        from_(a.from + static_cast<std::size_t>(channel) * a.nranks),
        sp_(Scratchpad::carve(shared, a.nranks)) {
    stage_ = a.staging + static_cast<std::size_t>(channel) * (a.nranks + 1) * a.llPayload;
  }

  __device__ void run() {
    if (a_.trace != nullptr && threadIdx.x == 0) {
      trace_ = a_.trace + static_cast<std::size_t>(channel_) * kTraceWords;
      trace_[0] = a_.traceCall;
      trace_[1] = globalTimer();
      std::uint32_t sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      trace_[4] = sm;
    }
    for (int q = threadIdx.x; q < a_.nranks; q += blockDim.x) {
      sp_.sent[q] = to_[q].counter != nullptr ? *to_[q].counter : 0;
      sp_.received[q] = from_[q].counter != nullptr ? *from_[q].counter : 0;
    }
    if (threadIdx.x == 0) {
      // A communicator some kernel aborted runs nothing more (even what would not wait).
      const std::uint32_t aborted = *reinterpret_cast<volatile std::uint32_t*>(a_.aborts[a_.rank]);
      if (aborted != 0) fail(a_, 2, channel_, -1, -1);
      *sp_.failed = aborted != 0 ? 1 : 0;
    }
    __syncthreads();
    bool ok = *sp_.failed == 0;
    for (std::size_t pass = 0; ok && pass < a_.passes; ++pass) {
      pass_ = static_cast<int>(pass);
      offset_ = code_.part * a_.partElems + pass * a_.sliceElems;
      room_ = lesser(a_.sliceElems, a_.partElems - pass * a_.sliceElems);
      for (std::uint32_t i = 0; ok && i < code_.nsteps; ++i) ok = step(i);
    }
    __syncthreads();
    if (trace_ != nullptr) {
      trace_[2] = globalTimer();
      trace_[3] = traced_;
    }
    for (int q = threadIdx.x; q < a_.nranks; q += blockDim.x) {
      if (to_[q].counter != nullptr) *to_[q].counter = sp_.sent[q];
      if (from_[q].counter != nullptr) *from_[q].counter = sp_.received[q];
    }
  }

 private:
  __device__ Piece<T> piece(Buf buf, std::uint32_t block) const {
    if (buf == Buf::scratch) {
      const std::size_t len = offset_ < a_.blockElems ? a_.blockElems - offset_ : 0;
      const std::size_t n = lesser(len, room_);
      return {n == 0 ? nullptr : reinterpret_cast<T*>(a_.scratch) + block * a_.blockElems + offset_,
              n};
    }
    const std::size_t B = a_.blocksPerSegment;
    const std::size_t seg = block / B, kb = block % B;
    const std::size_t start = kb * a_.blockElems;
    const std::size_t blockLen = a_.count > start ? lesser(a_.blockElems, a_.count - start) : 0;
    const std::size_t len = offset_ < blockLen ? blockLen - offset_ : 0;
    const std::size_t n = lesser(len, room_);
    if (n == 0) return {};
    T* base = buf == Buf::input ? static_cast<T*>(const_cast<void*>(a_.input))
                                : static_cast<T*>(a_.output);
    return {base + seg * a_.count + start + offset_, n};
  }

  // The k-th block of a span list.
  __device__ static BlockRef blockAt(const Span* spans, std::uint32_t nspans, std::uint32_t k) {
    for (std::uint32_t i = 0; i < nspans; ++i) {
      const Span& sp = spans[i];
      if (k < sp.count) {
        return {sp.buf, static_cast<std::uint32_t>(static_cast<std::int64_t>(sp.first) +
                                                   static_cast<std::int64_t>(k) * sp.stride)};
      }
      k -= sp.count;
    }
    return {Buf::input, 0};
  }
  __device__ static std::uint32_t blocksIn(const Span* spans, std::uint32_t nspans) {
    std::uint32_t n = 0;
    for (std::uint32_t i = 0; i < nspans; ++i) n += spans[i].count;
    return n;
  }

  // Thread 0: waits until *word >= want; false (with the failure recorded) if it never does.
  __device__ bool waitFor(const std::uint64_t* word, std::uint64_t want, int peer, int step) {
    return waitAtLeast(a_, word, want, channel_, peer, step, pass_);
  }

  // Every thread: copies the ll message `line` (nwords lines, flag `flag`) into `to`; fails with
  // code 3 on a line of this message from another call.
  __device__ bool unpack(const std::uint64_t* lines, std::uint32_t* to, std::size_t nwords,
                         std::uint32_t flag, int peer, int step) {
    for (std::size_t i = threadIdx.x; i < nwords; i += blockDim.x) {
      Watch w(a_);
      std::uint64_t v;
      while (static_cast<std::uint32_t>((v = loadVolatile(lines + i)) >> 32) != flag) {
        const auto got = static_cast<std::uint32_t>(v >> 32);
        if (kSigned && llOtherCall(got, flag)) {
          fail(a_, 3, channel_, peer, step,
               Seen{pass_, static_cast<int>(i), got & 0xffu, a_.signature});
          *sp_.failed = 1;
          return false;
        }
        if (int why = w.check(); why != 0) {
          fail(a_, why, channel_, peer, step,
               Seen{pass_, static_cast<int>(i), static_cast<std::uint32_t>(v >> 32), flag});
          *sp_.failed = 1;
          return false;
        }
      }
      to[i] = static_cast<std::uint32_t>(v);
    }
    return true;
  }

  // One step as the kernel reads it.
  struct View {
    Step st;
    algo::StepTraits t;
    const int* recvPeers;
    const int* sendPeers;
    const Span* src;
    const Span* dst;
    std::uint32_t nsrc, ndst, nblocks;
    std::size_t msgBytes;
    int idx;
  };
  __device__ View view(std::uint32_t index) const {
    View v;
    v.st = code_.steps[index];
    v.t = algo::traits(v.st.kind);
    v.recvPeers = code_.peers + v.st.peerBegin;
    v.sendPeers = v.recvPeers + v.st.nrecv;
    v.src = code_.spans + v.st.srcBegin;
    v.dst = code_.spans + v.st.dstBegin;
    v.nsrc = blocksIn(v.src, v.st.nsrc);
    v.ndst = blocksIn(v.dst, v.st.ndst);
    v.nblocks = v.nsrc > v.ndst ? v.nsrc : v.ndst;
    v.msgBytes = v.nblocks * a_.strideBytes;
    v.idx = static_cast<int>(index);
    return v;
  }

  // Thread 0: waits for room at every send peer and (simple) every receive peer's message;
  // false, with the failure recorded, if one never comes.
  __device__ bool waitRoomAndMessages(const View& v) {
    const std::size_t K = static_cast<std::size_t>(a_.slots);
    bool ok = true;
    for (std::uint32_t k = 0; ok && k < v.st.nsend; ++k) {
      const int q = v.sendPeers[k];
      // Slot sent % K is free once the receiver has consumed message sent - K.
      ok = waitFor(to_[q].tail, sp_.sent[q] + 1 > K ? sp_.sent[q] + 1 - K : 0, q, v.idx);
    }
    if (P == Protocol::simple) {
      for (std::uint32_t k = 0; ok && k < v.st.nrecv; ++k) {
        const int q = v.recvPeers[k];
        ok = waitFor(from_[q].head, sp_.received[q] + 1, q, v.idx);
        // The message's signature, stored before its head: the peer's call is this one.
        const std::uint64_t theirs =
            ok && kSigned ? loadVolatile(from_[q].sigs + sp_.received[q] % K) : a_.signature;
        if (theirs != a_.signature) {
          fail(a_, 3, channel_, q, v.idx, Seen{pass_, -1, theirs, a_.signature});
          ok = false;
        }
      }
    }
    return ok;
  }

  // Every thread: the step's data, from its sources and received messages to its destination
  // and its messages (simple: straight into the send peers' slots; ll: into the staging area).
  // Rewrites this warp's lists, so no lane may still read an earlier step's.
  __device__ void move(const View& v) {
    const Step& st = v.st;
    const std::size_t stride = a_.strideBytes;
    const std::size_t K = static_cast<std::size_t>(a_.slots);
    const bool leader = (threadIdx.x & 31u) == 0;
    __syncwarp();
    for (std::uint32_t k = 0; leader && k < st.nrecv; ++k) {
      const int q = v.recvPeers[k];
      if constexpr (P == Protocol::simple) {
        sp_.msgs[k] = from_[q].slots + (sp_.received[q] % K) * a_.slotBytes;
      } else {
        sp_.msgs[k] = stage_ + (1 + k) * a_.llPayload;
      }
    }
    // Where this step's message is written: every send peer's slot (simple), or the staging
    // area that is then packed into every peer's lines (ll).
    const std::uint32_t ntargets = P == Protocol::simple ? st.nsend : (st.nsend > 0 ? 1 : 0);
    for (std::uint32_t k = 0; leader && k < ntargets; ++k) {
      const int q = v.sendPeers[k];
      sp_.targets[k] =
          P == Protocol::simple ? to_[q].slots + (sp_.sent[q] % K) * a_.slotBytes : stage_;
    }
    __syncwarp();

    // The same cases as the CpuExecutor's Runner.
    for (std::uint32_t j = 0; j < v.nblocks; ++j) {
      // The warp's operand lists: none of its lanes may still read block j - 1's.
      if (j > 0) __syncwarp();
      const std::size_t at = j * stride;
      Piece<T> s{}, d{};
      if (v.t.readsSrc) {
        const auto b = blockAt(v.src, st.nsrc, j);
        s = piece(b.buf, b.block);
      }
      if (v.t.writesDst) {
        const auto b = blockAt(v.dst, st.ndst, j);
        d = piece(b.buf, b.block);
      }
      int nins = 0, nouts = 0;
      auto in = [&](const void* p) {
        if (leader) sp_.ins[nins] = p;
        ++nins;
      };
      auto out = [&](void* p) {
        if (leader) sp_.outs[nouts] = p;
        ++nouts;
      };
      std::size_t n = 0;
      auto msg = [&](std::uint32_t k) { return reinterpret_cast<const T*>(sp_.msgs[k] + at); };
      auto target = [&](std::uint32_t k) { return reinterpret_cast<T*>(sp_.targets[k] + at); };
      // The first of this block's ins that a peer wrote (simple's slots; ll's are staged here).
      const int fromPeers = P == Protocol::simple ? 0 : 1 << 30;
      int peers = 1 << 30;
      switch (st.kind) {
        case StepKind::send:
          in(s.at);
          for (std::uint32_t k = 0; k < ntargets; ++k) out(target(k));
          n = s.elems;
          break;
        case StepKind::recv:
          in(msg(0));
          peers = fromPeers;
          out(d.at);
          n = d.elems;
          break;
        case StepKind::recvCopySend:  // what lies past this rank's piece follows
          in(msg(0));
          peers = fromPeers;
          out(d.at);
          for (std::uint32_t k = 0; k < ntargets; ++k) out(target(k));
          n = d.elems;
          break;
        case StepKind::recvReduceSend:
          in(s.at);
          for (std::uint32_t k = 0; k < st.nrecv; ++k) in(msg(k));
          peers = fromPeers + 1;
          for (std::uint32_t k = 0; k < ntargets; ++k) out(target(k));
          n = s.elems;
          break;
        case StepKind::recvReduceCopy:
        case StepKind::recvReduceCopySend:
          in(s.at);
          for (std::uint32_t k = 0; k < st.nrecv; ++k) in(msg(k));
          peers = fromPeers + 1;
          out(d.at);
          for (std::uint32_t k = 0; k < ntargets; ++k) out(target(k));
          n = lesser(s.elems, d.elems);
          break;
        case StepKind::copy:
          in(s.at);
          out(d.at);
          n = s.at == d.at ? 0 : lesser(s.elems, d.elems);
          break;
        case StepKind::reduceLocal:
          in(d.at);
          in(s.at);
          out(d.at);
          n = lesser(s.elems, d.elems);
          break;
      }
      __syncwarp();
      elementwise<T, Op>(reinterpret_cast<T* const*>(sp_.outs), nouts,
                         reinterpret_cast<const T* const*>(sp_.ins), nins, peers, n);
      if (st.kind == StepKind::recvCopySend) {
        // The forward carries the whole slice: a downstream block may be longer than this
        // rank's piece (a scratch block, or one past this rank's count), whose n elements went
        // out in the same pass as the copy (reading the message once: on the H200 the separate
        // forward of the whole slice took 35-37 us a 256 KiB step where a step of as many bytes
        // moved took 22). Usually nothing is left.
        const std::size_t head = n * sizeof(T);
        const std::size_t lead = lesser(stride, (head + 15) / 16 * 16) - lesser(head, stride);
        for (std::uint32_t k = 0; head < stride && k < ntargets; ++k) {
          std::byte* to = sp_.targets[k] + at + head;
          const std::byte* from = sp_.msgs[0] + at + head;
          copyBytes(to, from, lead, P == Protocol::simple);
          copyBytes(to + lead, from + lead, stride - head - lead, P == Protocol::simple);
        }
      }
    }
  }

  // Thread 0, after the fence: the step's messages posted (simple: each slot's signature, then
  // the head) and its received ones freed.
  __device__ void publish(const View& v) {
    for (std::uint32_t k = 0; k < v.st.nsend; ++k) {
      const int q = v.sendPeers[k];
      if constexpr (P == Protocol::simple && kSigned) {
        const std::size_t K = static_cast<std::size_t>(a_.slots);
        storeVolatile(to_[q].sigs + sp_.sent[q] % K, a_.signature);
      }
      ++sp_.sent[q];
      if constexpr (P == Protocol::simple) storeRelease(a_, to_[q].head, sp_.sent[q]);
    }
    for (std::uint32_t k = 0; k < v.st.nrecv; ++k) {
      const int q = v.recvPeers[k];
      storeRelease(a_, from_[q].tail, ++sp_.received[q]);
    }
  }

  // Runs the step at `index`: false if the block must stop.
  __device__ bool step(std::uint32_t index) {
    const View v = view(index);
    const Step& st = v.st;

    // Thread 0's trace of this step (WEFT_GPU_TRACE): began, waited, moved.
    std::uint64_t* mark = trace_ != nullptr && traced_ < kTraceSteps
                              ? trace_ + kTraceHeader + 3 * static_cast<std::size_t>(traced_)
                              : nullptr;
    if (trace_ != nullptr) ++traced_;
    if (mark != nullptr) mark[0] = globalTimer();

    // 1. Room at every send peer; the message of every receive peer.
    if (threadIdx.x == 0 && !waitRoomAndMessages(v)) *sp_.failed = 1;
    if constexpr (P == Protocol::ll) {
      const std::size_t K = static_cast<std::size_t>(a_.slots);
      const std::size_t lineCount = 2 * a_.llPayload / 8;
      for (std::uint32_t k = 0; k < st.nrecv; ++k) {
        const int q = v.recvPeers[k];
        const std::uint64_t n = sp_.received[q];
        auto* into = reinterpret_cast<std::uint32_t*>(stage_ + (1 + k) * a_.llPayload);
        if (!unpack(from_[q].lines + (n % K) * lineCount, into, v.msgBytes / 4,
                    llFlag(n + 1, a_.signature), q, v.idx))
          break;
      }
    }
    __syncthreads();
    if (*sp_.failed != 0) return false;
    if (mark != nullptr) mark[1] = globalTimer();

    // 2. The data.
    move(v);
    __syncthreads();
    if (mark != nullptr) mark[2] = globalTimer();

    // 3. Post: ll packs the staged message into every send peer's lines, flag and data together.
    if constexpr (P == Protocol::ll) {
      const std::size_t K = static_cast<std::size_t>(a_.slots);
      const std::size_t lineCount = 2 * a_.llPayload / 8;
      const auto* words = reinterpret_cast<const std::uint32_t*>(stage_);
      for (std::uint32_t k = 0; k < st.nsend; ++k) {
        const int q = v.sendPeers[k];
        const std::uint64_t n = sp_.sent[q];
        std::uint64_t* lines = to_[q].lines + (n % K) * lineCount;
        const std::uint64_t flag = llFlag(n + 1, a_.signature);
        for (std::size_t i = threadIdx.x; i < v.msgBytes / 4; i += blockDim.x)
          storeVolatile(lines + i, flag << 32 | words[i]);
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      if (WEFT_GPU_POST_FENCE != 0 && (st.nsend > 0 || st.nrecv > 0)) fence(a_);
      publish(v);
    }
    if (P == Protocol::ll || WEFT_GPU_SIMPLE_POST_BARRIER != 0) __syncthreads();
    return true;
  }

  const LaunchArgs& a_;
  int channel_;
  ChannelCode code_;
  const Endpoint* to_;
  const Endpoint* from_;
  Scratchpad sp_;
  std::byte* stage_ = nullptr;
  std::size_t offset_ = 0, room_ = 0;
  int pass_ = 0;
  std::uint64_t* trace_ = nullptr;  // thread 0's, when tracing
  std::uint32_t traced_ = 0;        // steps run, when tracing
};

template <typename T, typename Op, Protocol P>
__global__ void __launch_bounds__(kThreads) scheduleKernel(const LaunchArgs a) {
  extern __shared__ __align__(16) std::byte shared[];
  Runner<T, Op, P>(a, static_cast<int>(blockIdx.x), shared).run();
}

template <typename T, typename Op>
__global__ void __launch_bounds__(kThreads)
    primitiveKernel(T* out, const T* a, const T* b, std::size_t count) {
  // Each block one contiguous share, in whole 64-byte lines.
  constexpr std::size_t kLine = 64 / sizeof(T);
  const std::size_t share = (count + gridDim.x - 1) / gridDim.x;
  const std::size_t per = (share + kLine - 1) / kLine * kLine;
  const std::size_t begin = blockIdx.x * per;
  if (begin >= count) return;
  const std::size_t n = lesser(per, count - begin);
  T* const outs[1] = {out + begin};
  const T* const ins[2] = {a + begin, b == nullptr ? nullptr : b + begin};
  elementwise<T, Op>(outs, 1, ins, b == nullptr ? 1 : 2, 1 << 30, n);
}

__global__ void __launch_bounds__(kThreads) p2pKernel(const LaunchArgs a, const P2pArgs p) {
  __shared__ int failed;
  __shared__ std::uint64_t seq;
  const P2pLane lane = p.lanes[blockIdx.x];
  const Endpoint e = lane.isSend != 0 ? a.to[lane.peer] : a.from[lane.peer];  // channel 0
  const std::size_t K = static_cast<std::size_t>(a.slots);
  if (threadIdx.x == 0) {
    failed = *reinterpret_cast<volatile std::uint32_t*>(a.aborts[a.rank]) != 0 ? 1 : 0;
    if (failed != 0) fail(a, 2, 0, -1, -1);
    seq = *e.counter;
  }
  __syncthreads();
  for (int k = 0; failed == 0 && k < lane.count; ++k) {
    const P2pOp op = p.ops[lane.first + k];
    // Each message signed with its operation's size: a receive of another size fails.
    const std::uint32_t sig = a.signature != 0 ? signatureOf(op.bytes) : 0;
    for (std::uint64_t off = 0; failed == 0 && off < op.bytes; off += a.slotBytes) {
      const std::size_t len = lesser(a.slotBytes, op.bytes - off);
      if (threadIdx.x == 0) {
        const std::uint64_t* word = lane.isSend != 0 ? e.tail : e.head;
        const std::uint64_t want = lane.isSend != 0 ? (seq + 1 > K ? seq + 1 - K : 0) : seq + 1;
        if (!waitAtLeast(a, word, want, 0, lane.peer, k)) {
          failed = 1;
        } else if (kSigned && lane.isSend == 0) {
          const std::uint64_t theirs = loadVolatile(e.sigs + seq % K);
          if (theirs != sig) {
            fail(a, 3, 0, lane.peer, k, Seen{-1, -1, theirs, sig});
            failed = 1;
          }
        }
      }
      __syncthreads();
      if (failed != 0) break;
      std::byte* slot = e.slots + (seq % K) * a.slotBytes;
      if (lane.isSend != 0) {
        copyBytes(slot, op.buf + off, len, false);
      } else {
        copyBytes(op.buf + off, slot, len, true);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        if (kSigned && lane.isSend != 0) storeVolatile(e.sigs + seq % K, sig);
        fence(a);
        ++seq;
        storeRelease(a, lane.isSend != 0 ? e.head : e.tail, seq);
      }
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) *e.counter = seq;
}

// A barrier of block b across the ranks on word `word` of its flag: once the whole block is done
// with what comes before, thread 0 raises this rank's word to `call` (word 0: directFlag, the
// call's signature beside it); then every thread waits until the word reaches `call` on every
// rank, thread q watching rank q (so the ranks' flags are polled side by side, not one after
// another: at 8 ranks that was 8 round trips a barrier), and at word 0 compares the signature.
// `failed` (shared) is set if some rank never gets there. Ends with the block synchronized.
__device__ void barrierEveryRank(const LaunchArgs& a, int b, int word, std::uint64_t call,
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
__device__ bool directStart(const LaunchArgs& a, int b, const std::uint64_t* counts, int* failed,
                            std::uint64_t* next) {
  if (threadIdx.x == 0) {
    *failed = *reinterpret_cast<volatile std::uint32_t*>(a.aborts[a.rank]) != 0 ? 1 : 0;
    if (*failed != 0) fail(a, 2, b, -1, -1);
    *next = counts[b] + 1;
  }
  __syncthreads();
  return *failed == 0;
}

// outs = rank 0's (op) rank 1's (op) ... (op) rank n-1's elements [at, at + n) of the buffers
// bases[q] + offset (bytes), in rank order: ranks 0..63, then the running sum (outs[0]) and up to
// 63 more at a time; outs past the first get only the final sum (one may be a slab a later group
// still reads). `ins` is shared memory that thread 0 fills.
template <typename T, typename Op>
__device__ void sumInRankOrder(const LaunchArgs& a, std::byte* const* bases, std::size_t offset,
                               std::size_t at, std::size_t n, T* const* outs, int nouts,
                               const T** ins) {
  for (int first = 0; first < a.nranks;) {
    const int take = first == 0 ? (a.nranks < 64 ? a.nranks : 64)
                                : (a.nranks - first < 63 ? a.nranks - first : 63);
    const int nins = first > 0 ? take + 1 : take;
    if (threadIdx.x == 0) {
      int k = 0;
      if (first > 0) ins[k++] = outs[0];
      for (int q = first; q < first + take; ++q)
        ins[k++] = reinterpret_cast<const T*>(bases[q] + offset) + at;
    }
    __syncthreads();
    const bool last = first + take >= a.nranks;
    elementwise<T, Op>(outs, last ? nouts : 1, ins, nins, first > 0 ? 1 : 0, n);
    __syncthreads();
    first += take;
  }
}

// The direct all-reduce kernels: block b takes the b-th slab's worth of the input and copies it
// into its slab of this rank's inbox (two per block, alternating by the block's call count),
// then raises word 0 of its flag to the call count.
//   One-shot: it sums slab b of every rank, in rank order, into its output.
//   Two-shot: the slab is cut into one piece per rank; it sums piece `rank` of every rank's
//   slab, in rank order, into its output and back into its own slab, raises word 1, and copies
//   every other rank's summed piece into its output.
// Each element is summed in rank order on one rank only, so every rank gets the same bits.
// A slab is rewritten two calls of that block later; in the call between, every rank waited for
// every peer's word 0 of that call, which a peer raises only after finishing the call before.
// On registered inputs (a.registered) nothing is copied: word 0 says "my input is there" (it is,
// the kernel being ordered after whatever wrote it), and the sums read every rank's input in
// place. No rank's stream may go on to change an input a peer still reads: one-shot raises
// word 2 after summing and waits for every rank's; two-shot's wait for word 1 already is that
// (a rank raises it after its last read of the inputs). Two-shot may also run in place on them:
// piece q of every input is read by rank q alone, which writes its sum there only after reading
// it, and copies the other pieces in only after word 1, when every rank is done reading.
template <typename T, typename Op, bool TwoShot>
__global__ void __launch_bounds__(kThreads) directKernel(const LaunchArgs a) {
  __shared__ int failed;
  __shared__ std::uint64_t first;
  __shared__ const T* ins[64];
  __shared__ T* pushes[64];  // two-shot on registered outputs: every rank's output piece
  const int b = static_cast<int>(blockIdx.x);
  if (!directStart(a, b, a.directCounts, &failed, &first)) return;
  const std::size_t per = a.directShareElems;
  // A call larger than the blocks' slabs hold runs in rounds: round k takes the k-th grid's
  // worth of the input, and counts as a call of its own (its parity picks the slab, its flags
  // are raised to its count), so the slabs alternate from round to round as from call to call.
  const std::size_t stride = per * gridDim.x;
  const std::size_t rounds = a.count == 0 ? 1 : (a.count + stride - 1) / stride;
  std::uint64_t call = first;
  for (std::size_t round = 0; round < rounds && failed == 0; ++round, ++call) {
    const std::size_t begin = round * stride + static_cast<std::size_t>(b) * per;
    const std::size_t n = begin < a.count ? lesser(per, a.count - begin) : 0;
    const std::size_t slab = (2 * static_cast<std::size_t>(b) + (call & 1)) * a.directSlabBytes;
    T* const out = static_cast<T*>(a.output) + begin;
    // 1. This rank's share into its slab (unless peers read its registered input), then word
    // 0 of its flag; every rank's share.
    const bool inPlace = a.registered != nullptr;
    std::byte* const* const sources = inPlace ? a.registered : a.directSlabs;
    const std::size_t sourceAt = inPlace ? a.registeredOffset + begin * sizeof(T) : slab;
    T* mine = reinterpret_cast<T*>(a.directSlabs[a.rank] + slab);
    if (!inPlace) {
      T* const outs[1] = {mine};
      const T* const from[1] = {static_cast<const T*>(a.input) + begin};
      elementwise<T, Op>(outs, 1, from, 1, 1 << 30, n);
    }
    barrierEveryRank(a, b, 0, call, &failed);
    if (failed != 0) break;
    if constexpr (!TwoShot) {
      T* const outs[1] = {out};
      sumInRankOrder<T, Op>(a, sources, sourceAt, 0, n, outs, 1, ins);
      if (inPlace) {
        // 2. Done reading every rank's input: word 2; then wait until every rank is.
        barrierEveryRank(a, b, 2, call, &failed);
      }
    } else {
      // Pieces start 16 bytes apart, so vectors serve them.
      constexpr std::size_t kAlign = sizeof(T) >= 16 ? 1 : 16 / sizeof(T);
      const auto R = static_cast<std::size_t>(a.nranks);
      const std::size_t piece = ((n + R - 1) / R + kAlign - 1) / kAlign * kAlign;
      auto pieceAt = [&](std::size_t q) { return q * piece < n ? q * piece : n; };
      auto pieceLen = [&](std::size_t q) { return lesser(piece, n - pieceAt(q)); };
      const auto me = static_cast<std::size_t>(a.rank);
      if (a.registeredOut != nullptr) {
        // 2'. Registered outputs (64 ranks at most): piece `rank` summed straight into every
        // rank's output, then word 1; once every rank's word 1 is up, this rank's output is
        // whole. In place, a peer's output piece is that peer's input piece, which this rank
        // alone reads, element by element before writing it.
        if (threadIdx.x == 0) {
          for (int q = 0; q < a.nranks; ++q) {
            pushes[q] = reinterpret_cast<T*>(a.registeredOut[q] + a.registeredOutOffset) + begin +
                        pieceAt(me);
          }
        }
        __syncthreads();
        sumInRankOrder<T, Op>(a, sources, sourceAt, pieceAt(me), pieceLen(me), pushes, a.nranks,
                              ins);
        barrierEveryRank(a, b, 1, call, &failed);
        __syncthreads();
        continue;
      }
      // 2. Piece `rank` summed into this rank's slab and its output; word 1. The slab comes
      // first: past 64 ranks the running sum lives in outs[0], and the output may be this
      // rank's registered input (an in-place call), whose piece a later group still reads.
      {
        T* const outs[2] = {mine + pieceAt(me), out + pieceAt(me)};
        sumInRankOrder<T, Op>(a, sources, sourceAt, pieceAt(me), pieceLen(me), outs, 2, ins);
      }
      barrierEveryRank(a, b, 1, call, &failed);
      // 3. Every other rank's summed piece, read from its slab.
      if (failed == 0) {
        for (std::size_t q = 0; q < R; ++q) {
          if (q == me) continue;
          T* const outs[1] = {out + pieceAt(q)};
          const T* const from[1] = {reinterpret_cast<const T*>(a.directSlabs[q] + slab) +
                                    pieceAt(q)};
          elementwise<T, Op>(outs, 1, from, 1, 0, pieceLen(q));
        }
      }
    }
    // The next round rewrites shared lists and slabs: every thread done with this one.
    __syncthreads();
  }
  if (threadIdx.x == 0) a.directCounts[b] = call - 1;
}

// The direct kernels of the block collectives (launchDirectBlocks): block b takes the b-th
// share of each of the input's pieces (one for all-gather, one per rank for reduce-scatter and
// all-to-all), copies them into its slab of this rank's inbox, piece p at p * share, raises
// word 0 of its flag and waits for every rank's; then
//   all-gather: rank q's piece goes to block q of the output, for every q;
//   reduce-scatter: piece `rank` of every rank's slab, summed in rank order, is the output;
//   all-to-all: piece `rank` of rank q's slab goes to block q of the output, for every q.
// A peer's slab is read only by the same block, so the slabs alternate as the all-reduce's do
// (directKernel above), and the two kernels share the flags and call counts. In place is safe:
// a round copies its share of every piece before it writes any of the output's.
template <typename T, typename Op, DirectKind Kind>
__global__ void __launch_bounds__(kThreads) directBlocksKernel(const LaunchArgs a) {
  __shared__ int failed;
  __shared__ std::uint64_t first;
  __shared__ const T* ins[64];
  const int b = static_cast<int>(blockIdx.x);
  if (!directStart(a, b, a.directCounts, &failed, &first)) return;
  const auto R = static_cast<std::size_t>(a.nranks);
  const std::size_t pieces = Kind == DirectKind::gather ? 1 : R;
  const std::size_t share = a.directShareElems;
  const std::size_t stride = share * gridDim.x;
  const std::size_t rounds = a.count == 0 ? 1 : (a.count + stride - 1) / stride;
  const auto me = static_cast<std::size_t>(a.rank);
  std::uint64_t call = first;
  for (std::size_t round = 0; round < rounds && failed == 0; ++round, ++call) {
    const std::size_t begin = round * stride + static_cast<std::size_t>(b) * share;
    const std::size_t n = begin < a.count ? lesser(share, a.count - begin) : 0;
    const std::size_t slab = (2 * static_cast<std::size_t>(b) + (call & 1)) * a.directSlabBytes;
    T* const mine = reinterpret_cast<T*>(a.directSlabs[a.rank] + slab);
    for (std::size_t p = 0; p < pieces; ++p) {
      T* const outs[1] = {mine + p * share};
      const T* const from[1] = {static_cast<const T*>(a.input) + p * a.count + begin};
      elementwise<T, Op>(outs, 1, from, 1, 1 << 30, n);
    }
    barrierEveryRank(a, b, 0, call, &failed);
    if (failed != 0) break;
    if constexpr (Kind == DirectKind::reduceScatter) {
      T* const outs[1] = {static_cast<T*>(a.output) + begin};
      sumInRankOrder<T, Op>(a, a.directSlabs, slab + me * share * sizeof(T), 0, n, outs, 1, ins);
    } else {
      const std::size_t at = Kind == DirectKind::gather ? 0 : me * share;
      for (std::size_t q = 0; q < R; ++q) {
        T* const outs[1] = {static_cast<T*>(a.output) + q * a.count + begin};
        const T* const from[1] = {reinterpret_cast<const T*>(a.directSlabs[q] + slab) + at};
        elementwise<T, Op>(outs, 1, from, 1, q == me ? 1 << 30 : 0, n);
      }
    }
    // The next round rewrites this block's slab (the other parity) and shared lists.
    __syncthreads();
  }
  if (threadIdx.x == 0) a.directCounts[b] = call - 1;
}

// ---- the ll direct all-reduce ------------------------------------------------------------

// Bytes [at, at + 16) of p (zeros past `bytes`), with one vector load where it can.
__device__ __forceinline__ uint4 loadChunk(const std::byte* p, std::size_t at, std::size_t bytes) {
  if (at + 16 <= bytes && aligned16(p + at)) return *reinterpret_cast<const uint4*>(p + at);
  uint4 v = make_uint4(0, 0, 0, 0);
  auto* d = reinterpret_cast<unsigned char*>(&v);
  for (std::size_t k = 0; k < 16 && at + k < bytes; ++k)
    d[k] = static_cast<unsigned char>(p[at + k]);
  return v;
}

// Bytes [at, at + 16) of p, no further than `bytes`.
__device__ __forceinline__ void storeChunk(std::byte* p, std::size_t at, std::size_t bytes,
                                           uint4 v) {
  if (at + 16 <= bytes && aligned16(p + at)) {
    *reinterpret_cast<uint4*>(p + at) = v;
    return;
  }
  const auto* s = reinterpret_cast<const unsigned char*>(&v);
  for (std::size_t k = 0; k < 16 && at + k < bytes; ++k) p[at + k] = std::byte{s[k]};
}

// Two ll lines (4 bytes of data and the flag each), each 8-byte half stored whole.
__device__ __forceinline__ void storeLines(std::uint64_t* p, std::uint32_t x, std::uint32_t y,
                                           std::uint32_t flag) {
  const std::uint64_t f = std::uint64_t{flag} << 32;
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(f | x), "l"(f | y)
               : "memory");
}
__device__ __forceinline__ void loadLines(const std::uint64_t* p, std::uint64_t& x,
                                          std::uint64_t& y) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(p) : "memory");
}

// Programmatic dependent launch (sm_90): in a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization, waits until the stream's previous kernel
// has completed and its memory is visible (at once where there is none, or without the
// attribute); and lets the stream's next such kernel be scheduled once every block of this one
// has called it or exited.
__device__ __forceinline__ void waitForPreviousKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void releaseNextKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// launchDirectLl (schedule_kernel.hpp). `cap`: the data bytes a sender's place in an ll inbox
// holds (its lines take twice as many); `perBlock`: the 16-byte chunks of a piece each block
// takes. Each thread owns chunks of the pieces (the same in both loops, so in place is safe: a
// thread reads every piece's chunk before it writes the output's), a chunk being four lines.
// Every block counts the call in its own ll count, the grid being the same at every call, so
// every block's count (the lines' flag, and the parity) is the same, and the same on every rank.
template <typename T, typename Op, DirectKind Kind>
__global__ void __launch_bounds__(kThreads)
    directLlKernel(const LaunchArgs a, std::size_t cap, std::size_t perBlock) {
  __shared__ int failed;
  __shared__ std::uint64_t call;
  const int b = static_cast<int>(blockIdx.x);
  // The counts, the input and the inboxes are the previous call's until it has completed.
  waitForPreviousKernel();
  if (!directStart(a, b, a.llCounts, &failed, &call)) return;
  const std::size_t bytes = a.count * sizeof(T);  // of one piece
  const std::size_t chunks = (bytes + 15) / 16;
  const std::uint32_t flag = llFlag(call, a.signature);
  const auto N = static_cast<std::size_t>(a.nranks);
  const std::size_t parity = call & 1;
  // Where sender `from`'s lines go in rank `owner`'s inbox this call.
  auto place = [&](int owner, int from) {
    return reinterpret_cast<std::uint64_t*>(
        a.directLl[owner] + (parity * N + static_cast<std::size_t>(from)) * 2 * cap);
  };
  // Piece p of the input, of the output.
  constexpr bool kPieces = Kind == DirectKind::reduceScatter || Kind == DirectKind::exchange;
  const auto* in = static_cast<const std::byte*>(a.input);
  auto* out = static_cast<std::byte*>(a.output);
  auto input = [&](int p) { return kPieces ? in + static_cast<std::size_t>(p) * bytes : in; };
  constexpr bool kBlocksOut = Kind == DirectKind::gather || Kind == DirectKind::exchange;
  auto output = [&](int q) { return kBlocksOut ? out + static_cast<std::size_t>(q) * bytes : out; };
  const std::size_t first = static_cast<std::size_t>(b) * perBlock;
  const std::size_t last = first + perBlock < chunks ? first + perBlock : chunks;
  // Chunk c of a piece, as four lines, to rank q.
  auto push = [&](int q, std::size_t c, uint4 v) {
    std::uint64_t* l = place(q, a.rank) + 4 * c;
    storeLines(l, v.x, v.y, flag);
    storeLines(l + 2, v.z, v.w, flag);
  };
  for (std::size_t c = first + threadIdx.x; c < last; c += blockDim.x) {
    // Piece q to rank q, or the one input (loaded once) to every peer.
    const uint4 all = kPieces ? uint4{} : loadChunk(in, 16 * c, bytes);
    for (int q = 0; q < a.nranks; ++q) {
      if (q != a.rank) push(q, c, kPieces ? loadChunk(input(q), 16 * c, bytes) : all);
    }
  }
  auto high = [](std::uint64_t x) { return static_cast<std::uint32_t>(x >> 32); };
  bool gaveUp = false;
  for (std::size_t c = first + threadIdx.x; c < last && !gaveUp; c += blockDim.x) {
    uint4 sum = make_uint4(0, 0, 0, 0);
    for (int q = 0; q < a.nranks && !gaveUp; ++q) {
      uint4 v;
      if (q == a.rank) {
        v = loadChunk(input(a.rank), 16 * c, bytes);
      } else {
        const std::uint64_t* l = place(a.rank, q) + 4 * c;
        std::uint64_t x0, x1, x2, x3;
        Watch w(a);
        for (;;) {
          loadLines(l, x0, x1);
          loadLines(l + 2, x2, x3);
          if (high(x0) == flag && high(x1) == flag && high(x2) == flag && high(x3) == flag) break;
          if (kSigned && llOtherCall(high(x0), flag)) {
            fail(a, 3, b, q, -1, Seen{-1, static_cast<int>(c), high(x0) & 0xffu, a.signature});
            gaveUp = true;
            break;
          }
          if (int why = w.check(); why != 0) {
            fail(a, why, b, q, -1, Seen{-1, static_cast<int>(c), high(x0), flag});
            gaveUp = true;
            break;
          }
        }
        v = make_uint4(static_cast<std::uint32_t>(x0), static_cast<std::uint32_t>(x1),
                       static_cast<std::uint32_t>(x2), static_cast<std::uint32_t>(x3));
      }
      if constexpr (kBlocksOut) {
        if (!gaveUp) storeChunk(output(q), 16 * c, bytes, v);
      } else {
        sum = q == 0 ? v : combineVec<T, Op>(sum, v);
      }
    }
    if constexpr (!kBlocksOut) {
      if (!gaveUp) storeChunk(out, 16 * c, bytes, sum);
    }
  }
  __syncthreads();
  // Every rank's lines for this block have arrived: this block of every rank has started, so a
  // next kernel now waiting on the GPU cannot keep any of them from being resident.
  if (a.dependentLaunch) releaseNextKernel();
  if (threadIdx.x == 0) a.llCounts[b] = call;
}

template <typename T>
__global__ void divideKernel(T* data, std::size_t count, std::uint64_t n) {
  using C = typename Compute<T>::type;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const C x = static_cast<C>(data[i]);
    if constexpr (std::is_floating_point_v<C>) {
      data[i] = static_cast<T>(x / static_cast<C>(n));
    } else if constexpr (std::is_signed_v<C>) {
      const auto u = static_cast<std::uint64_t>(x);
      const std::uint64_t q = (x < 0 ? 0 - u : u) / n;
      data[i] = static_cast<T>(x < 0 ? 0 - q : q);
    } else {
      data[i] = static_cast<T>(x / n);
    }
  }
}

Status launchError(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return {};
  return {Code::systemError, std::string(what) + " launch failed: " + cudaGetErrorString(err)};
}

template <typename Fn>
decltype(auto) withProtocol(Protocol p, Fn&& fn) {
  if (p == Protocol::ll) return fn(std::integral_constant<Protocol, Protocol::ll>{});
  return fn(std::integral_constant<Protocol, Protocol::simple>{});
}

}  // namespace

Status launchSchedule(const LaunchArgs& args, int channels, DataType type, RedOp op, Protocol proto,
                      void* stream) {
  const std::size_t smem = Scratchpad::bytes(args.nranks);
  return withType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return withOp(op, [&](auto reduction) {
      using Op = decltype(reduction);
      return withProtocol(proto, [&](auto p) {
        auto kernel = scheduleKernel<T, Op, decltype(p)::value>;
        if (smem > 48 * 1024) {
          (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem));
        }
        kernel<<<static_cast<unsigned>(channels), kThreads, smem,
                 static_cast<cudaStream_t>(stream)>>>(args);
        return launchError("schedule kernel");
      });
    });
  });
}

Status launchPrimitive(void* out, const void* a, const void* b, std::size_t count, DataType type,
                       RedOp op, int blocks, void* stream) {
  if (count == 0) return {};
  return withType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return withOp(op, [&](auto reduction) {
      using Op = decltype(reduction);
      primitiveKernel<T, Op>
          <<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
              static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), count);
      return launchError("primitive kernel");
    });
  });
}

Status launchP2p(const LaunchArgs& args, const P2pArgs& p2p, void* stream) {
  if (p2p.nlanes == 0) return {};
  p2pKernel<<<static_cast<unsigned>(p2p.nlanes), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      args, p2p);
  return launchError("point-to-point kernel");
}

Status launchDirect(const LaunchArgs& args, int blocks, bool twoShot, DataType type, RedOp op,
                    void* stream) {
  return withType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return withOp(op, [&](auto reduction) {
      using Op = decltype(reduction);
      auto kernel = twoShot ? directKernel<T, Op, true> : directKernel<T, Op, false>;
      kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          args);
      return launchError(twoShot ? "two-shot kernel" : "one-shot kernel");
    });
  });
}

// Calls fn(Op{}, integral_constant<DirectKind, K>{}) for `kind`: the reducing kinds with `op`,
// the copying kinds (built for one op) with Sum.
template <typename Fn>
void withKind(DirectKind kind, RedOp op, Fn&& fn) {
  using K = DirectKind;
  if (kind == K::gather) {
    fn(Sum{}, std::integral_constant<K, K::gather>{});
  } else if (kind == K::exchange) {
    fn(Sum{}, std::integral_constant<K, K::exchange>{});
  } else {
    withOp(op, [&](auto reduction) {
      if (kind == K::allReduce) {
        fn(reduction, std::integral_constant<K, K::allReduce>{});
      } else {
        fn(reduction, std::integral_constant<K, K::reduceScatter>{});
      }
    });
  }
}

Status launchDirectBlocks(const LaunchArgs& args, int blocks, DirectKind kind, DataType type,
                          RedOp op, void* stream) {
  if (kind == DirectKind::allReduce)
    return internalError("launchDirectBlocks: all-reduce runs launchDirect");
  const auto grid = static_cast<unsigned>(blocks);
  auto* const st = static_cast<cudaStream_t>(stream);
  return withType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    withKind(kind, op, [&](auto reduction, auto k) {
      if constexpr (decltype(k)::value != DirectKind::allReduce)
        directBlocksKernel<T, decltype(reduction), decltype(k)::value>
            <<<grid, kThreads, 0, st>>>(args);
    });
    return launchError("direct block-collective kernel");
  });
}

Status launchDirectLl(const LaunchArgs& args, DirectKind kind, std::size_t cap, int blocks,
                      std::size_t leastBytes, DataType type, RedOp op, void* stream) {
  const std::size_t chunks = (args.count * sizeOf(type) + 15) / 16;
  // At least leastBytes a block, spread over as many blocks as that takes.
  const std::size_t least = std::max<std::size_t>(1, leastBytes / 16);
  const auto used = static_cast<std::size_t>(
      std::clamp<std::size_t>((chunks + least - 1) / least, 1, static_cast<std::size_t>(blocks)));
  const std::size_t perBlock = (chunks + used - 1) / used;
  const auto grid = static_cast<unsigned>(blocks);
  auto* const st = static_cast<cudaStream_t>(stream);
  return withType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    cudaError_t e = cudaSuccess;
    withKind(kind, op, [&](auto reduction, auto k) {
      auto* kernel = directLlKernel<T, decltype(reduction), decltype(k)::value>;
      if (!args.dependentLaunch) {
        kernel<<<grid, kThreads, 0, st>>>(args, cap, perBlock);
        return;
      }
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(grid);
      config.blockDim = dim3(kThreads);
      config.stream = st;
      config.attrs = attr;
      config.numAttrs = 1;
      e = cudaLaunchKernelEx(&config, kernel, args, cap, perBlock);
    });
    if (e != cudaSuccess)
      return Status(Code::systemError,
                    std::string("ll one-shot kernel launch failed: ") + cudaGetErrorString(e));
    return launchError("ll one-shot kernel");
  });
}

Status divide(void* data, std::size_t count, DataType type, std::uint64_t n, void* stream) {
  if (count == 0) return {};
  return withType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto blocks = static_cast<unsigned>(std::min<std::size_t>((count + 255) / 256, 1024));
    divideKernel<T>
        <<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<T*>(data), count, n);
    return launchError("divide kernel");
  });
}

namespace {

// Calls fn(T*, Op, integral_constant<Protocol>) for every dtype x element-wise op x protocol the
// kernels are instantiated for, until it returns an error.
template <typename Fn>
cudaError_t forEachInstance(Fn&& fn) {
  for (int t = 0; t < kNumDataTypes; ++t) {
    for (RedOp op : {RedOp::sum, RedOp::prod, RedOp::min, RedOp::max}) {
      for (Protocol p : algo::kAllProtocols) {
        const cudaError_t err = withType(static_cast<DataType>(t), [&](auto* tag) {
          return withOp(op, [&](auto reduction) {
            return withProtocol(p, [&](auto pc) { return fn(tag, reduction, pc); });
          });
        });
        if (err != cudaSuccess) return err;
      }
    }
  }
  return cudaSuccess;
}

}  // namespace

Result<int> residentBlocks(int nranks) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return Status(Code::systemError, "the device's SM count is unknown");
  }
  const std::size_t smem = Scratchpad::bytes(nranks);
  int fewest = 1 << 30;
  (void)forEachInstance([&](auto* tag, auto reduction, auto pc) {
    using T = std::remove_pointer_t<decltype(tag)>;
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &blocks, scheduleKernel<T, decltype(reduction), decltype(pc)::value>, kThreads, smem) !=
        cudaSuccess)
      blocks = 0;
    fewest = std::min(fewest, blocks);
    return cudaSuccess;
  });
  (void)cudaGetLastError();
  if (fewest <= 0) return Status(Code::systemError, "the schedule kernel does not fit an SM");
  return fewest * sms;
}

Status preload() {
  cudaFuncAttributes attr;
  cudaError_t err = cudaFuncGetAttributes(&attr, p2pKernel);
  if (err == cudaSuccess) {
    err = forEachInstance([&](auto* tag, auto reduction, auto pc) {
      using T = std::remove_pointer_t<decltype(tag)>;
      using Op = decltype(reduction);
      cudaError_t e = cudaFuncGetAttributes(&attr, scheduleKernel<T, Op, decltype(pc)::value>);
      if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, divideKernel<T>);
      if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, directKernel<T, Op, false>);
      if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, directKernel<T, Op, true>);
      if (e == cudaSuccess) {
        e = cudaFuncGetAttributes(&attr, directBlocksKernel<T, Op, DirectKind::reduceScatter>);
      }
      if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, directLlKernel<T, Op, DirectKind::allReduce>);
      if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, directLlKernel<T, Op, DirectKind::reduceScatter>);
      if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, directLlKernel<T, Sum, DirectKind::gather>);
      if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, directLlKernel<T, Sum, DirectKind::exchange>);
      if (e == cudaSuccess) {
        e = cudaFuncGetAttributes(&attr, directBlocksKernel<T, Sum, DirectKind::gather>);
      }
      if (e == cudaSuccess) {
        e = cudaFuncGetAttributes(&attr, directBlocksKernel<T, Sum, DirectKind::exchange>);
      }
      return e;
    });
  }
  if (err != cudaSuccess)
    return {Code::systemError,
            std::string("loading the schedule kernels: ") + cudaGetErrorString(err)};
  return {};
}

}  // namespace weft::device
