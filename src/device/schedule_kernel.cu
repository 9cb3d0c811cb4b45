// The schedule interpreter: one thread block per channel walks its rank's steps, moving each
// step's blocks in slices through the FIFO slots (simple) or as ll lines; the point-to-point and
// primitive kernels; the average's division; and the preload of every kernel file's instances.
#include "src/device/schedule_kernel.hpp"

#include <algorithm>
#include <string>

#include "src/device/elementwise.cuh"
#include "src/device/launch.cuh"
#include "src/device/ordering.cuh"

namespace weft::device {
namespace {

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
  __shared__ std::uint64_t seqs[kMaxP2pStripes];  // of the channels this block moves
  const P2pLane lane = p.lanes[blockIdx.x / p.perLane];
  const int mine = static_cast<int>(blockIdx.x) % p.perLane;
  const std::size_t N = static_cast<std::size_t>(a.nranks);
  auto endpoint = [&](int c) {
    const std::size_t at = static_cast<std::size_t>(c) * N + static_cast<std::size_t>(lane.peer);
    return lane.isSend != 0 ? a.to[at] : a.from[at];
  };
  const std::size_t K = static_cast<std::size_t>(a.slots);
  if (threadIdx.x == 0) {
    failed = *reinterpret_cast<volatile std::uint32_t*>(a.aborts[a.rank]) != 0 ? 1 : 0;
    if (failed != 0) fail(a, 2, 0, -1, -1);
    for (int c = mine; c < p.stripes; c += p.perLane) seqs[c] = *endpoint(c).counter;
  }
  __syncthreads();
  for (int k = 0; failed == 0 && k < lane.count; ++k) {
    const P2pOp op = p.ops[lane.first + k];
    // Each message signed with its operation's size: a receive of another size fails.
    const std::uint32_t sig = a.signature != 0 ? signatureOf(op.bytes) : 0;
    const std::uint64_t messages = (op.bytes + a.slotBytes - 1) / a.slotBytes;
    const auto stripes =
        static_cast<int>(messages < static_cast<std::uint64_t>(p.stripes) ? messages : p.stripes);
    std::uint64_t j = 0;
    for (std::uint64_t off = 0; failed == 0 && off < op.bytes; off += a.slotBytes, ++j) {
      const int c = static_cast<int>(j % static_cast<std::uint64_t>(stripes));
      if (c % p.perLane != mine) continue;
      const Endpoint e = endpoint(c);
      const std::size_t len = lesser(a.slotBytes, op.bytes - off);
      std::uint64_t& seq = seqs[c];
      if (threadIdx.x == 0) {
        const std::uint64_t* word = lane.isSend != 0 ? e.tail : e.head;
        const std::uint64_t want = lane.isSend != 0 ? (seq + 1 > K ? seq + 1 - K : 0) : seq + 1;
        if (!waitAtLeast(a, word, want, c, lane.peer, k)) {
          failed = 1;
        } else if (kSigned && lane.isSend == 0) {
          const std::uint64_t theirs = loadVolatile(e.sigs + seq % K);
          if (theirs != sig) {
            fail(a, 3, c, lane.peer, k, Seen{-1, -1, theirs, sig});
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
  if (threadIdx.x == 0) {
    for (int c = mine; c < p.stripes; c += p.perLane) *endpoint(c).counter = seqs[c];
  }
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
  p2pKernel<<<static_cast<unsigned>(p2p.nlanes * p2p.perLane), kThreads, 0,
              static_cast<cudaStream_t>(stream)>>>(args, p2p);
  return launchError("point-to-point kernel");
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
      return e;
    });
  }
  if (err == cudaSuccess) err = preloadDirect();
  if (err == cudaSuccess) err = preloadLl();
  if (err != cudaSuccess)
    return {Code::systemError,
            std::string("loading the schedule kernels: ") + cudaGetErrorString(err)};
  return {};
}

}  // namespace weft::device
