// The CUDA executor's kernel: one thread block per channel walks this rank's step list once per
// slice, exactly as the CpuExecutor's Runner does on the host (same geometry, same message
// layout), moving messages through FIFOs in GPU memory that peers map with CUDA IPC.
//
// A connection (sender s -> receiver r, one channel) is K slots in r's memory for each protocol,
// a head counter in r's memory (messages s has posted) and a tail counter in s's memory (messages
// r has consumed): each side polls only its own memory and writes only the other's.
//  - simple (bulk): s waits for tail + K > n, writes slot n % K and its signature word, then a
//    system-scope release of head = n + 1; r acquires head > n, compares the signature, reads
//    the slot, releases tail = n + 1.
//  - ll (low latency): each 8-byte line carries 4 bytes of data and a 4-byte flag (llFlag of
//    n + 1 and the call's signature), so r polls the data itself and no separate flag round trip
//    or fence is needed; tail as above.
// Both protocols share one sequence per connection, so calls of either protocol follow each other.
//
// Host-includable: no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "algorithms/cost_model.hpp"
#include "algorithms/schedule.hpp"
#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::device {

#if defined(__CUDACC__)
#define WEFT_HOST_DEVICE __host__ __device__
#else
#define WEFT_HOST_DEVICE
#endif

// Call signatures (WEFT_CHECK_CALLS): 32 bits that stand for a call (its collective, dtype,
// count, op and root; a point-to-point operation's size), which every message between ranks
// carries so that a receiver fails at once on a peer's different call:
//  - the simple protocol's messages in the word of their slot beside the head (Endpoint::sigs),
//    a point-to-point message its operation's size's signature;
//  - the direct kernels' first flag beside the round's count (directFlag);
//  - ll lines in their flag's low 8 bits (llFlag), beside 24 bits of the count.
// A kernel that sees a peer's differ fails with KernelError code 3. Signature 0: unchecked.
WEFT_HOST_DEVICE constexpr std::uint32_t signatureOf(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  const auto s = static_cast<std::uint32_t>(x);
  return s == 0 ? 1 : s;
}
// An ll line's flag: the message (or call) count's low 24 bits, then 8 bits (1 to 255, never 0:
// a line never written is never taken for one of another call) folded from the signature.
WEFT_HOST_DEVICE constexpr std::uint32_t llFlag(std::uint64_t count, std::uint32_t signature) {
  const std::uint32_t fold =
      (signature ^ signature >> 8 ^ signature >> 16 ^ signature >> 24) & 0xffu;
  return static_cast<std::uint32_t>(count) << 8 | (fold % 255 + 1);
}
// Whether an ll line's flag `got` is the one `want` stands for, but of another call.
WEFT_HOST_DEVICE constexpr bool llOtherCall(std::uint32_t got, std::uint32_t want) {
  return got != want && got >> 8 == want >> 8 && (got & 0xffu) != 0;
}
// A direct kernel's first flag: the round's count's low 32 bits, then the signature.
WEFT_HOST_DEVICE constexpr std::uint64_t directFlag(std::uint64_t count, std::uint32_t signature) {
  return static_cast<std::uint64_t>(static_cast<std::uint32_t>(count)) << 32 | signature;
}

// One direction of one channel with one peer, as this rank's kernel sees it.
struct Endpoint {
  std::byte* slots = nullptr;        // simple: K slots of slotBytes, in the receiver's memory
  std::uint64_t* lines = nullptr;    // ll: K slots of llLines lines, in the receiver's memory
  std::uint64_t* head = nullptr;     // posted, in the receiver's memory
  std::uint64_t* sigs = nullptr;     // simple: K slots' signatures, beside head
  std::uint64_t* tail = nullptr;     // consumed, in the sender's memory
  std::uint64_t* counter = nullptr;  // this rank's count on this endpoint (its own memory)
};

// One channel's program for this rank, in device memory.
struct ChannelCode {
  const algo::Step* steps = nullptr;
  std::uint32_t nsteps = 0;
  const int* peers = nullptr;
  const algo::Span* spans = nullptr;
  std::uint32_t part = 0;
};

// Why a kernel stopped early (written once, to host-mapped memory).
struct KernelError {
  std::int32_t code = 0;  // 0 none, 1 timed out, 2 aborted, 3 a peer's call differs
  std::int32_t channel = -1;
  std::int32_t peer = -1;
  std::int32_t step = -1;
  std::int32_t pass = -1;  // the pass of the schedule's steps, where there is one
  std::int32_t line = -1;  // ll: the line waited for
  std::uint64_t have = 0;  // what the awaited word (or the ll line's flag) held; code 3: the
                           // peer's signature (its low 8 bits where line >= 0: an ll line)
  std::uint64_t want = 0;  // what it waited for; code 3: this rank's signature
};

struct LaunchArgs {
  const ChannelCode* channels = nullptr;   // [channel]
  const Endpoint* to = nullptr;            // [channel * nranks + peer]
  const Endpoint* from = nullptr;          // [channel * nranks + peer]
  std::byte* staging = nullptr;            // [channel]: (nranks + 1) * llPayload bytes each
  std::uint32_t* const* aborts = nullptr;  // [rank]: every rank's device abort word (own first
                                           // checked; all set on failure)
  const volatile std::int32_t* hostAbort = nullptr;  // this rank's host abort word, mapped
  KernelError* error = nullptr;                      // host-mapped
  std::uint64_t timeoutNs = 0;
  int nranks = 1, rank = 0;
  int slots = 4;
  // 1 when every rank's kernels run on this GPU (threads or processes sharing it): the flags and
  // fences between ranks then need device scope only, not system scope (which also orders
  // against the host and other GPUs; on the H200 device scope was 3-16 % faster).
  int deviceScope = 0;
  std::size_t slotBytes = 0;  // simple slot
  std::size_t llPayload = 0;  // bytes of data an ll slot carries (half its lines' bytes)
  // Geometry (exec::Geometry), and the stride each block's slice takes in a message.
  std::size_t blockElems = 0, partElems = 0, sliceElems = 0, passes = 0, count = 0;
  std::size_t strideBytes = 0;
  std::uint32_t blocksPerSegment = 1;
  const void* input = nullptr;
  void* output = nullptr;
  std::byte* scratch = nullptr;
  // The call's signature (signatureOf; 0: unchecked). Point-to-point: non-zero signs each
  // message with its operation's size's.
  std::uint32_t signature = 0;
  // Direct all-reduce (launchDirect): every rank's per-block flags (words 0, 1 and 2 of each
  // 64-byte line) and slabs, this rank's per-block call counts.
  std::uint64_t* const* directFlags = nullptr;  // [rank]
  std::byte* const* directSlabs = nullptr;      // [rank]
  std::uint64_t* directCounts = nullptr;
  std::size_t directSlabBytes = 0;
  // The elements a block takes of the call (launchDirect) or of each piece (launchDirectBlocks)
  // in a round: at most a slab's worth, fewer to spread a small call over more blocks.
  std::size_t directShareElems = 0;
  std::byte* const* directLl = nullptr;  // [rank]: every rank's ll inbox (launchDirectLl)
  std::uint64_t* llCounts = nullptr;     // this rank's per-block ll call counts
  // launchDirectLl: launched as a programmatic dependent of the stream's previous kernel (its
  // blocks wait for that kernel's completion before touching memory), each block letting the
  // stream's next kernel be scheduled once its peers' lines have all arrived
  // (exec::GpuOptions::dependentLaunch); else a plain launch.
  bool dependentLaunch = false;
  // One-shot on registered inputs: every rank's registered buffer as mapped here, and where this
  // call's input sits in it (the same offset on every rank). Peers read the inputs in place:
  // nothing is copied into the slabs, and no rank finishes before every rank has read.
  std::byte* const* registered = nullptr;  // [rank], device memory; null: the slab path
  std::size_t registeredOffset = 0;
  // Two-shot on registered outputs (at most 64 ranks): every rank's registered buffer holding
  // its output, and where the output sits in it. Each rank writes its summed piece into every
  // rank's output itself, so nothing is gathered after the second flag.
  std::byte* const* registeredOut = nullptr;  // [rank], device memory; null: the gather
  std::size_t registeredOutOffset = 0;
  // WEFT_GPU_TRACE: kTraceWords words per block of this call (null: no trace). Thread 0 of each
  // block writes the call number, %globaltimer at its start and end, the steps it ran, its SM,
  // then for each of its first kTraceSteps steps the time it began waiting, the time its wait
  // ended (after the block barrier) and the time its data was moved (after the next barrier).
  std::uint64_t* trace = nullptr;
  std::uint64_t traceCall = 0;
};

inline constexpr int kTraceSteps = 256;
inline constexpr int kTraceHeader = 8;
inline constexpr int kTraceWords = kTraceHeader + 3 * kTraceSteps;
inline constexpr int kTraceCalls = 16;  // the last calls' records are kept

inline constexpr int kThreads = 512;

// Point-to-point on GPU memory: each lane (one peer and direction) moves its operations in call
// order, in messages of one simple slot; message j of an operation of m messages goes through
// channel j % min(stripes, m) of the connection with that peer (both ends derive it from the
// size alone), so a large operation streams through several FIFOs at once. A lane has `perLane`
// thread blocks (each end its own count), block b taking the channels c with c % perLane == b,
// each in message order: both ends keep one order, so any matched pattern completes. Lanes run
// side by side. The lists travel in the kernel's parameters (graph-capturable), hence a bound
// on their length.
inline constexpr int kMaxP2pOps = 768;
inline constexpr int kMaxP2pLanes = 256;
inline constexpr int kMaxP2pStripes = 8;  // channels an operation's messages spread over
struct P2pOp {
  std::byte* buf = nullptr;
  std::uint64_t bytes = 0;
};
struct P2pLane {
  std::int32_t peer = 0;
  std::int32_t isSend = 0;
  std::int32_t first = 0;  // ops[first, first + count)
  std::int32_t count = 0;
};
struct P2pArgs {
  std::int32_t nlanes = 0;
  std::int32_t stripes = 1;  // at most kMaxP2pStripes, and the communicator's channels
  std::int32_t perLane = 1;  // blocks a lane (at most stripes)
  P2pLane lanes[kMaxP2pLanes];
  P2pOp ops[kMaxP2pOps];
};

static_assert(sizeof(P2pArgs) + sizeof(LaunchArgs) < 32000, "kernel parameters are at most 32 KB");

// Runs the schedule on `stream` (a cudaStream_t), one block per channel. avg reduces as sum.
Status launchSchedule(const LaunchArgs& args, int channels, DataType type, RedOp op,
                      algo::Protocol proto, void* stream);

// The element-wise primitive every step uses (16-byte vectors, eight in flight per thread), alone
// over a grid of `blocks` blocks: out = a (op) b, or a copy of a when b is null. What the
// primitive's bandwidth is measured with (weft-bench).
Status launchPrimitive(void* out, const void* a, const void* b, std::size_t count, DataType type,
                       RedOp op, int blocks, void* stream);

// Runs every lane of `p2p` on `stream`: one block per lane. Of `args`, the endpoints, failure
// words, slots and timeout are used.
Status launchP2p(const LaunchArgs& args, const P2pArgs& p2p, void* stream);

// All-reduce of args.count elements from args.input to args.output (in place allowed) through
// every rank's slabs, over `blocks` blocks, each one slab's share: each rank copies its share
// into its slab, raises its flag and waits for every peer's. One-shot: each rank sums every
// rank's slab in rank order 0..n-1. Two-shot: rank r sums piece r of every slab in rank order,
// back into its slab, raises a second flag, and copies the other ranks' summed pieces. Either
// way each element is summed in one order, so every rank gets the same bits. Double-buffered by
// each block's call parity: a slab is rewritten two calls later, after every peer has shown (by
// its next flag) that it read it.
Status launchDirect(const LaunchArgs& args, int blocks, bool twoShot, DataType type, RedOp op,
                    void* stream);

// All-gather, reduce-scatter or all-to-all of args.count elements per block through every
// rank's slabs, over `blocks` blocks, in rounds as launchDirect's: each rank copies its share of
// every piece of its input into its slab (piece p at p * directShare), raises its flag and waits
// for every peer's, then takes what it needs from every rank's slab: all-gather rank q's piece
// into output block q; reduce-scatter piece `rank` of every slab summed in rank order; all-to-all
// piece `rank` of rank q's slab into output block q. The op matters to reduce-scatter only.
// The collective a direct kernel (launchDirectBlocks, launchDirectLl) runs; launchDirectBlocks
// takes the last three (all-reduce has launchDirect).
enum class DirectKind { allReduce, gather, reduceScatter, exchange };
Status launchDirectBlocks(const LaunchArgs& args, int blocks, DirectKind kind, DataType type,
                          RedOp op, void* stream);
// A piece's share of one block's slab, in elements (16-byte multiples), for a kernel whose
// input has `pieces` pieces: the kernel and its launcher cut alike.
constexpr std::size_t directShare(std::size_t slabBytes, std::size_t elementBytes,
                                  std::size_t pieces) {
  const std::size_t align = elementBytes >= 16 ? 1 : 16 / elementBytes;
  return slabBytes / elementBytes / pieces / align * align;
}

// One-shot collective of a small call whose pieces (args.count elements each: the all-reduce's
// input, the all-gather's, one rank's share of a reduce-scatter's or all-to-all's) hold at most
// `cap` bytes, pushed as ll lines (8 bytes: 4 of data, and the call count with the signature as the
// flag (llFlag), stored at once, so a line is whole or absent and needs no fence) into every peer's
// ll inbox at this rank's place (two parities by the call count): all-reduce and all-gather push
// the input to every peer, reduce-scatter and all-to-all piece q to rank q. Then every thread waits
// for its lines from every rank, taking its own from the input: all-reduce and reduce-scatter sum
// them in rank order 0..n-1 (every rank gets the same bits), all-gather and all-to-all put rank q's
// in output block q. The grid is `blocks` blocks at every call of a communicator (each counts
// the call in its own word of args.llCounts, so the counts agree); a call takes as many as give
// each at least leastBytes of a piece, the rest only count. A parity is rewritten two calls later,
// after every peer's next call showed (by its lines) that it finished this one.
Status launchDirectLl(const LaunchArgs& args, DirectKind kind, std::size_t cap, int blocks,
                      std::size_t leastBytes, DataType type, RedOp op, void* stream);

// data[i] /= n, on `stream` (the end of an avg).
Status divide(void* data, std::size_t count, DataType type, std::uint64_t n, void* stream);

// How many blocks of the schedule kernel (any dtype, op and protocol, at this rank count) the
// current device holds at once. Ranks' kernels wait on each other, so every block of every
// rank sharing a device must be resident together (MPS and threads run them concurrently).
Result<int> residentBlocks(int nranks);

// Loads every kernel this file defines, so that a kernel spinning on a peer never waits for the
// lazy loading of another (see ../shared/DEVICE.md).
Status preload();

}  // namespace weft::device
