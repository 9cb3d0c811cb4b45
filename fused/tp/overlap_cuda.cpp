// runTp on the GPU: the chunks' collectives on a side stream of the communicator's, its GEMMs on
// the caller's stream (or in turn on it and a second side stream), each waiting for the other's
// through events (capturable: the side streams fork from the caller's and join it again). The fused
// variants move blocks with the copy engine between buffers the ranks map, ordered by flags
// (flags.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "fused/cuda_steps.hpp"
#include "fused/tp/flags.hpp"
#include "fused/tp/gemm.hpp"
#include "fused/tp/overlap.hpp"
#include "fused/tp/scales.hpp"
#include "fused/tp/sum.hpp"

namespace weft::fused::tp {
namespace {

Status cudaFailed(const char* what, cudaError_t e) {
  return Status(Code::systemError,
                std::string("tensor-parallel ") + what + ": " + cudaGetErrorString(e));
}

// The fused calls' buffer, one a rank, every rank's mapped by every other: flags, 64 bytes
// apart, then the data: the gathered A (all-gather), or every rank's partial block of this
// rank's rows (reduce-scatter). The flags: the call count; "my block is in" (all-gather); one a
// peer, raised by it into this buffer once it has copied this rank's block (all-gather) or its
// partial block has landed here (reduce-scatter); "my stream is done with my buffer"; then the
// gate's call count and its flag (Run::gate).
constexpr int kFusedMaxRanks = algo::kTpFusedMaxRanks;
static_assert(kFusedMaxRanks <= FlagList::kMost);
constexpr std::size_t kFlagStride = 64;
constexpr std::size_t kFlagsBytes = 16384;  // (5 + kFusedMaxRanks) flags, rounded up
static_assert((5 + kFusedMaxRanks) * kFlagStride <= kFlagsBytes);

struct Shared {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  Communicator::PeerMemory peers;  // empty: not mappable (every rank alike)
  std::uint64_t* flag(int rank, int index) const {
    return reinterpret_cast<std::uint64_t*>(peers.at[static_cast<std::size_t>(rank)] +
                                            static_cast<std::size_t>(index) * kFlagStride);
  }
  std::byte* data(int rank) const { return peers.at[static_cast<std::size_t>(rank)] + kFlagsBytes; }
};
// Flag indices; kDone + the peer; kFree: every call's last, on the owner's stream.
constexpr int kEpoch = 0, kReady = 1, kDone = 2, kFree = kDone + kFusedMaxRanks;
constexpr int kGateCount = kFree + 1, kGate = kFree + 2;
constexpr std::uint64_t kGateSteps = 128;  // more than a call's collectives (two a chunk)

// What a communicator keeps for its tensor-parallel calls.
struct State {
  SideStream side;
  SideStream gemmSide;  // the second stream of a chunked call's GEMMs (WEFT_TP_GEMM_STREAMS=2)
  std::set<std::tuple<int, std::size_t, std::size_t, std::size_t, int, int, bool, bool, int>>
      primed;  // the calls whose GEMMs ran once (Run::primeGemms)
  std::unique_ptr<Gemms> gemms;
  Shared shared;
  // Freed only with the communicator: cudaFree waits for the whole device, where another rank's
  // kernel may wait for this rank's next one.
  std::vector<void*> memory;
  std::vector<std::shared_ptr<void>> mappings;
  ~State() {
    side.destroy();  // before the memory its work may use
    gemmSide.destroy();
    shared.peers.keep.reset();
    mappings.clear();
    for (void* p : memory) cudaFree(p);
  }
};

// Makes the fused buffer at least `bytes`, mapped by every rank: collective (every rank's same
// call grows it alike), outside a capture. False where the ranks cannot map it.
Result<bool> ensureShared(Communicator& comm, State& st, std::size_t bytes, cudaStream_t stream) {
  if (st.shared.bytes >= bytes) return !st.shared.peers.at.empty();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(stream, &capture); e != cudaSuccess)
    return cudaFailed("capture status", e);
  if (capture != cudaStreamCaptureStatusNone)
    return Status(Code::invalidUsage,
                  "a communicator's first tensor-parallel call (and a fused one larger than any "
                  "before) sets up a buffer the ranks share: make one call of the shape before "
                  "capturing it");
  // Nobody copies from the old buffer any more once every rank has synchronized and met in
  // the mapping below.
  for (cudaStream_t s : {stream, st.side.stream}) {
    if (cudaError_t e = cudaStreamSynchronize(s); e != cudaSuccess) return cudaFailed("sync", e);
  }
  const std::size_t size = std::max(bytes, 2 * st.shared.bytes);
  void* fresh = nullptr;
  if (cudaError_t e = cudaMalloc(&fresh, size); e != cudaSuccess)
    return cudaFailed("allocating the shared buffer", e);
  st.memory.push_back(fresh);
  cudaError_t e = cudaMemsetAsync(fresh, 0, kFlagsBytes, st.side.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(st.side.stream);
  if (e != cudaSuccess) return cudaFailed("clearing the flags", e);
  auto peers = comm.mapPeerMemory(fresh);
  if (!peers) return peers.status();
  // The old buffer and its mappings stay until the communicator goes (State::memory).
  st.mappings.push_back(std::move(st.shared.peers.keep));
  st.shared = {static_cast<std::byte*>(fresh), size, std::move(*peers)};
  return !st.shared.peers.at.empty();
}

Result<State*> stateOf(Communicator& comm) {
  std::shared_ptr<void>& slot = comm.fusedState("tp");
  if (slot) return static_cast<State*>(slot.get());
  auto s = std::make_shared<State>();
  if (Status made = s->side.create(); !made) return made;
  if (Status made = s->gemmSide.create(); !made) return made;
  auto gemms = Gemms::create();
  if (!gemms) return gemms.status();
  s->gemms = std::move(*gemms);
  s->gemms->setFitting(comm.config().tpGemmFit);
  void* words = nullptr;
  if (cudaError_t e = cudaMalloc(&words, 2 * sizeof(std::uint64_t)); e != cudaSuccess)
    return cudaFailed("flag words", e);
  s->memory.push_back(words);
  if (Status loaded = loadFlagKernels(static_cast<std::uint64_t*>(words), s->side.stream); !loaded)
    return loaded;
  if (Status loaded = loadSumKernels(); !loaded) return loaded;
  if (Status loaded = loadScaleKernels(); !loaded) return loaded;
  slot = s;
  return s.get();
}

class Run {
 public:
  Run(Communicator& comm, const TpCall& x, const algo::TpPlan& plan, State& st, std::byte* ws,
      const TpWorkspace& layout, const Shared* gated, std::uint64_t timeoutNs)
      : gated_(gated),
        timeoutNs_(timeoutNs),
        comm_(comm),
        x_(x),
        plan_(plan),
        st_(st),
        gemmWs_(ws),
        staging_(ws + layout.staging),
        gatheredScales_(reinterpret_cast<float*>(ws + layout.gatheredScales)),
        packedScales_(reinterpret_cast<float*>(ws + layout.packedScales)),
        chunkPackedScales_(reinterpret_cast<float*>(ws + layout.chunkPackedScales)),
        tileScales_(reinterpret_cast<float*>(ws + layout.tileScales)),
        n_(static_cast<std::size_t>(comm.size())),
        shape_(x.shape(comm.size())),
        rows_(x.m / n_),
        blocks_(scaleBlocks(shape_)),
        es_(sizeOf(x.type)),
        cs_(sizeOf(x.out)),
        stream_(static_cast<cudaStream_t>(x.stream)),
        gemmStreams_(gemmStreams(comm.config(), x.op)) {
    for (int j = 0; gated_ != nullptr && j < comm.size(); ++j)
      gates_.at[gates_.count++] = gated_->flag(j, kGate);
  }

  Status allGatherGemm() {
    auto* c = static_cast<std::byte*>(x_.c);
    auto* gathered = static_cast<std::byte*>(x_.gathered);
    if (Status s = follow(st_.side.stream, stream_, st_.side.fork); !s) return s;
    if (Status s = forkLanes(); !s) return s;
    if (Status s = startGates(); !s) return s;
    for (int i = 0; i < plan_.chunks; ++i) {
      ChunkGemm ch = chunk(plan_.chunks, i);
      const int l = lane(i);
      // Every rank's collectives before this one are done (before the first, the ranks' work
      // before the call): an early rank's next all-gather, launched as a programmatic dependent
      // of its last, could otherwise hold the SMs a late rank's needs.
      if (Status s = gate(2 * i); !s) return s;
      // Every rank's rows of this chunk, rank by rank; straight into the gathered A unchunked.
      std::byte* g =
          plan_.chunks == 1 && gathered != nullptr ? gathered : staging_ + ch.aOffset * es_;
      if (Status s = dry_ ? Status{} : gatherRows(ch, x_.a, g, x_.k, x_.type, gathered); !s)
        return s;
      // Block-scaled: the rows' scales likewise.
      const float* scales = gatheredScales_ + ch.start * n_ * blocks_;
      if (x_.blockScales && !dry_) {
        if (Status s = gate(2 * i + 1); !s) return s;
        if (Status s = gatherScales(ch); !s) return s;
        if (plan_.chunks == 1 && x_.gatheredScales != nullptr) scales = x_.gatheredScales;
      }
      if (Status s = follow(laneStream(l), st_.side.stream, st_.side.chunk); !s) return s;
      ch.shape.bias = x_.bias != nullptr;
      ch.shape.smCount = overlapSms(i + 1 < plan_.chunks);
      auto sc = scalesFor(ch, scales, ch.rows * blocks_, l);
      if (!sc) return sc.status();
      if (Status s = st_.gemms->run(ch.shape, g, x_.b, c + ch.cOffset * cs_, x_.bias, laneWs(l),
                                    laneStream(l), *sc);
          !s)
        return s;
    }
    if (Status s = joinLanes(); !s) return s;
    return follow(stream_, st_.side.stream, st_.side.join);
  }

  // A chunk's rows of every rank into `to` (rows of `width` values), rank by rank, on the side
  // stream, from this rank's rows at `from`; then into `gathered` (rows_ a block) where asked
  // for and not already there. Rows `step` apart (an interleaved chunk) are first packed into this
  // rank's place in `to`, which the all-gather then takes in place.
  Status gatherRows(const ChunkGemm& ch, const void* from, void* to, std::size_t width,
                    DataType type, void* gathered) {
    const std::size_t rowBytes = width * sizeOf(type);
    auto* dst = static_cast<std::byte*>(to);
    const std::size_t piece = ch.rows * rowBytes;
    const std::byte* send = static_cast<const std::byte*>(from) + ch.first * rowBytes;
    if (ch.step > 1) {
      std::byte* mine = dst + static_cast<std::size_t>(comm_.rank()) * piece;
      if (cudaError_t e = cudaMemcpy2DAsync(mine, rowBytes, send, ch.step * rowBytes, rowBytes,
                                            ch.rows, cudaMemcpyDeviceToDevice, st_.side.stream);
          e != cudaSuccess)
        return cudaFailed("a chunk's rows", e);
      send = mine;
    }
    if (Status s = comm_.allGather(send, dst, ch.rows * width, type, st_.side.stream); !s) return s;
    if (gathered == nullptr || gathered == to) return {};
    // Into each rank's block of the gathered A: an interleaved chunk's staged rows `step` rows
    // apart from row `first`, in one copy (each rank's block is `step` × its rows); else each
    // rank's piece a block apart.
    auto* out = static_cast<std::byte*>(gathered) + ch.first * rowBytes;
    const bool flat = ch.step > 1;
    const std::size_t bytes = flat ? rowBytes : piece, height = flat ? n_ * ch.rows : n_;
    const std::size_t pitch = flat ? ch.step * rowBytes : rows_ * rowBytes;
    if (cudaError_t e = cudaMemcpy2DAsync(out, pitch, dst, bytes, bytes, height,
                                          cudaMemcpyDeviceToDevice, st_.side.stream);
        e != cudaSuccess)
      return cudaFailed("gathered A", e);
    return {};
  }

  // A chunk's rows' block scales, every rank's, rank by rank on the side stream (unchunked,
  // straight into the gathered scales where asked for), and into the gathered scales.
  Status gatherScales(const ChunkGemm& ch) {
    float* staged = gatheredScales_ + ch.start * n_ * blocks_;
    float* out = x_.gatheredScales;
    float* to = plan_.chunks == 1 && out != nullptr ? out : staged;
    return gatherRows(ch, x_.scales.a, to, blocks_, DataType::f32, out);
  }

  // The own block's GEMM at once, from A; on the side stream the own block into the shared
  // buffer, then each peer's copied from the peer's buffer by the copy engine, a piece's GEMM
  // (algo::tpFusedPieces) waiting for its blocks' copies alone.
  Status allGatherGemmFused(const Shared& sh, std::uint64_t timeoutNs) {
    const int me = comm_.rank();
    const std::size_t colsL = x_.cols / n_, block = agBlockBytes(), scaleBlock = agScaleBytes();
    auto* c = static_cast<std::byte*>(x_.c);
    std::uint64_t* epoch = sh.flag(me, kEpoch);
    if (Status s = countCall(epoch, stream_); !s) return s;
    std::byte* mine = sh.data(me);
    // On the side stream beside the own block's GEMM (which reads A itself): the own block into
    // the shared buffer, then the peers'.
    if (Status s = shareOwnBlock(sh, me, mine, timeoutNs); !s) return s;
    for (const algo::TpPiece& p : pieces()) {
      const auto first = static_cast<std::size_t>(p.first);
      const void* a = x_.a;
      if (p.first != me) {
        for (int j = p.first; j < p.first + p.count; ++j) {
          const auto J = static_cast<std::size_t>(j);
          if (Status s =
                  awaitFlags(sh.flag(j, kReady), 0, 1, -1, epoch, 0, timeoutNs, st_.side.stream);
              !s)
            return s;
          for (auto [to, from, bytes] :
               {std::tuple{agBlock(mine, J), agBlock(sh.data(j), J), block},
                std::tuple{agScales(mine, J), agScales(sh.data(j), J), scaleBlock}}) {
            if (bytes == 0) continue;
            if (cudaError_t e =
                    cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, st_.side.stream);
                e != cudaSuccess)
              return cudaFailed("a peer's block", e);
          }
        }
        if (Status s = follow(stream_, st_.side.stream, st_.side.chunk); !s) return s;
        for (int j = p.first; j < p.first + p.count; ++j) {
          if (Status s = raiseFlag(sh.flag(j, kDone + me), epoch, st_.side.stream); !s) return s;
        }
        a = mine + first * block;
      }
      GemmShape g = pieceShape(p);
      g.bias = x_.bias != nullptr;
      // The own block's scales: A's own (its copy in the shared buffer may not have landed).
      const auto* blockScales =
          p.first == me ? x_.scales.a : reinterpret_cast<const float*>(agScales(mine, first));
      auto sc = scalesFor(blockScales, 0, g.m, 1);
      if (!sc) return sc.status();
      if (Status s = st_.gemms->run(g, a, x_.b, c + first * rows_ * colsL * cs_, x_.bias, gemmWs_,
                                    stream_, *sc);
          !s)
        return s;
    }
    if (Status s = follow(stream_, st_.side.stream, st_.side.join); !s) return s;
    if (Status s = copyGathered(mine); !s) return s;
    return raiseFlag(sh.flag(me, kFree), epoch, stream_);
  }

  // In place (ranks sharing the device): every rank's block (and its scales) into one buffer,
  // rank 0's second region (inPlaceBlocks), on the side stream once every rank is done with rank
  // 0's buffer in the call before; then the GEMMs of algo::tpInPlacePieces (one of every row)
  // once each block is in, from where it lies: no block is copied more than once.
  Status allGatherGemmInPlace(const Shared& sh, std::uint64_t timeoutNs) {
    const int me = comm_.rank(), n = comm_.size();
    const std::size_t colsL = x_.cols / n_;
    auto* c = static_cast<std::byte*>(x_.c);
    std::uint64_t* epoch = sh.flag(me, kEpoch);
    if (Status s = countCall(epoch, stream_); !s) return s;
    std::byte* blocks = inPlaceBlocks(sh);
    if (Status s = shareOwnBlock(sh, 0, blocks, timeoutNs); !s) return s;
    if (Status s = follow(stream_, st_.side.stream, st_.side.join); !s) return s;
    for (const algo::TpPiece& p : pieces()) {
      FlagList ready;
      for (int j = p.first; j < p.first + p.count; ++j)
        if (j != me) ready.at[ready.count++] = sh.flag(j, kReady);
      if (Status s = awaitEach(ready, epoch, 1, 0, timeoutNs, stream_); !s) return s;
      const auto first = static_cast<std::size_t>(p.first);
      GemmShape g = pieceShape(p);
      g.bias = x_.bias != nullptr;
      auto sc = scalesFor(reinterpret_cast<const float*>(agScales(blocks, first)), 0, g.m, 1);
      if (!sc) return sc.status();
      if (Status s =
              st_.gemms->run(g, agBlock(blocks, first), x_.b, c + first * rows_ * colsL * cs_,
                             x_.bias, gemmWs_, stream_, *sc);
          !s)
        return s;
    }
    if (Status s = copyGathered(blocks); !s) return s;
    // Done with rank 0's buffer; every other rank's untouched (each hears it, as after any call).
    FlagList done;
    for (int d = 0; d < n; ++d)
      if (d != me) done.at[done.count++] = sh.flag(d, kDone + me);
    if (Status s = raiseEach(done, epoch, stream_); !s) return s;
    return raiseFlag(sh.flag(me, kFree), epoch, stream_);
  }

  // In place (ranks sharing the device): the GEMM of algo::tpInPlacePieces (one of every row)
  // writes this rank's partial C into its own buffer, once every rank is done with it in the call
  // before; then, every rank's "ready" flag up, the sum of this rank's block from each rank's
  // buffer where it lies, in rank order; then every peer hears this rank is done with its buffer.
  Status gemmReduceScatterInPlace(const Shared& sh, std::uint64_t timeoutNs) {
    const int n = comm_.size(), me = comm_.rank();
    const std::size_t depth = x_.k / n_, block = rows_ * x_.cols * cs_;
    const auto* a = static_cast<const std::byte*>(x_.a);
    std::uint64_t* epoch = sh.flag(me, kEpoch);
    if (Status s = beginFused(sh, timeoutNs); !s) return s;
    for (const algo::TpPiece& p : pieces()) {
      const auto first = static_cast<std::size_t>(p.first);
      const GemmShape g = pieceShape(p);
      auto sc = scalesFor(aScales(first * rows_), 0, g.m, 1);
      if (!sc) return sc.status();
      if (Status s = sumGemm(g, a + first * rows_ * depth * es_, sh.data(me) + first * block, *sc);
          !s)
        return s;
    }
    if (Status s = raiseFlag(sh.flag(me, kReady), epoch, stream_); !s) return s;
    FlagList ready, done;
    BlockList parts;
    for (int p = 0; p < n; ++p) {
      parts.at[parts.count++] = sh.data(p) + static_cast<std::size_t>(me) * block;
      if (p == me) continue;
      ready.at[ready.count++] = sh.flag(p, kReady);
      done.at[done.count++] = sh.flag(p, kDone + me);
    }
    if (Status s = awaitEach(ready, epoch, 1, 0, timeoutNs, stream_); !s) return s;
    if (Status s = sumBlocks(x_.c, parts, rows_ * x_.cols, x_.out, stream_); !s) return s;
    if (Status s = raiseEach(done, epoch, stream_); !s) return s;
    return raiseFlag(sh.flag(me, kFree), epoch, stream_);
  }

  // The GEMMs of each rank's rows in pieces (algo::tpFusedPieces), the next peer's first and this
  // rank's last: a piece's partial blocks copied into their peers' buffers by the copy engine on
  // the side stream as the next piece's GEMM runs, this rank's written into its own; then the
  // sum of the n blocks here.
  Status gemmReduceScatterFused(const Shared& sh, std::uint64_t timeoutNs) {
    const int n = comm_.size(), me = comm_.rank();
    const std::size_t depth = x_.k / n_, block = rows_ * x_.cols * cs_;  // A's columns
    const auto* a = static_cast<const std::byte*>(x_.a);
    std::uint64_t* epoch = sh.flag(me, kEpoch);
    if (Status s = beginFused(sh, timeoutNs); !s) return s;
    if (Status s = follow(st_.side.stream, stream_, st_.side.fork); !s) return s;
    for (const algo::TpPiece& p : pieces()) {
      const auto first = static_cast<std::size_t>(p.first);
      std::byte* out = p.first == me ? sh.data(me) + first * block : staging_ + first * block;
      const GemmShape g = pieceShape(p);
      auto sc = scalesFor(aScales(first * rows_), 0, g.m, 1);
      if (!sc) return sc.status();
      if (Status s = sumGemm(g, a + first * rows_ * depth * es_, out, *sc); !s) return s;
      if (p.first == me) break;
      if (Status s = follow(st_.side.stream, stream_, st_.side.chunk); !s) return s;
      for (int d = p.first; d < p.first + p.count; ++d) {
        const auto D = static_cast<std::size_t>(d);
        if (Status s = usersDone(sh, d, timeoutNs, st_.side.stream); !s) return s;
        if (cudaError_t e = cudaMemcpyAsync(sh.data(d) + static_cast<std::size_t>(me) * block,
                                            staging_ + D * block, block, cudaMemcpyDeviceToDevice,
                                            st_.side.stream);
            e != cudaSuccess)
          return cudaFailed("a partial block", e);
        if (Status s = raiseFlag(sh.flag(d, kDone + me), epoch, st_.side.stream); !s) return s;
      }
    }
    // Every peer's block has landed; this rank's copies are done (the staging is free again).
    if (Status s = awaitFlags(sh.flag(me, kDone), kFlagStride, n, me, epoch, 0, timeoutNs, stream_);
        !s)
      return s;
    if (Status s = follow(stream_, st_.side.stream, st_.side.join); !s) return s;
    if (Status s = sumBlocks(x_.c, sh.data(me), n, rows_ * x_.cols, x_.out, stream_); !s) return s;
    return raiseFlag(sh.flag(me, kFree), epoch, stream_);
  }

  Status gemmReduceScatter() {
    const auto* a = static_cast<const std::byte*>(x_.a);
    auto* c = static_cast<std::byte*>(x_.c);
    if (Status s = follow(st_.side.stream, stream_, st_.side.fork); !s) return s;
    if (Status s = forkLanes(); !s) return s;
    if (Status s = startGates(); !s) return s;
    for (int i = 0; i < plan_.chunks; ++i) {
      ChunkGemm ch = chunk(plan_.chunks, i);
      const int l = lane(i);
      std::byte* partial = staging_ + ch.cOffset * cs_;
      ch.shape.smCount = overlapSms(i > 0);
      // A's rows of the chunk in each rank's block, blocks a rank's rows apart.
      auto sc = scalesFor(ch, aScales(ch.start), rows_ * blocks_, l);
      if (!sc) return sc.status();
      if (Status s = sumGemm(ch.shape, a + ch.aOffset * es_, partial, *sc, l); !s) return s;
      if (Status s = follow(st_.side.stream, laneStream(l), st_.side.chunk); !s) return s;
      if (Status s = gate(i); !s) return s;  // every rank's GEMM of the chunk is done
      if (Status s =
              dry_ ? Status{}
                   : comm_.reduceScatter(partial, c + ch.start * x_.cols * cs_, ch.rows * x_.cols,
                                         x_.out, RedOp::sum, st_.side.stream);
          !s)
        return s;
    }
    if (Status s = joinLanes(); !s) return s;
    return follow(stream_, st_.side.stream, st_.side.join);
  }

 private:
  // A chunked call's GEMMs take the GEMM streams in turn, chunk i the (i mod streams)-th: the
  // caller's, then the communicator's second, so one chunk's last wave of tiles runs beside the
  // next one's first (WEFT_TP_GEMM_STREAMS). Priming, the caller's alone.
  bool twoLanes() const { return lane(1) != 0; }
  int lane(int i) const { return dry_ ? 0 : gemmLane(gemmStreams_, plan_.chunks, i); }
  cudaStream_t laneStream(int l) const { return l == 0 ? stream_ : st_.gemmSide.stream; }
  std::byte* laneWs(int l) const {
    return gemmWs_ + static_cast<std::size_t>(l) * Gemms::kWorkspaceBytes;
  }
  Status forkLanes() {
    return twoLanes() ? follow(st_.gemmSide.stream, stream_, st_.gemmSide.fork) : Status{};
  }
  Status joinLanes() {
    return twoLanes() ? follow(stream_, st_.gemmSide.stream, st_.gemmSide.join) : Status{};
  }

  // The fused calls' GEMMs' shapes once, each piece's (its inputs' values left as they are).
  Status fusedGemmsOnce() {
    const std::size_t me = static_cast<std::size_t>(comm_.rank());
    const bool ag = x_.op == algo::TpOp::allGatherGemm;
    // Every piece size of any rank, in order: the same GEMM shapes on every rank, which ranks
    // tuning together need (Gemms::Agree). Each from block 0: the call overwrites what it writes.
    std::set<int> sizes;
    for (int r = 0; r < comm_.size(); ++r)
      for (const algo::TpPiece& p : pieces(r)) sizes.insert(p.count);
    for (const int count : sizes) {
      GemmShape g = pieceShape({0, count});
      g.bias = x_.bias != nullptr;
      Status s;
      if (ag) {
        // The own block from A itself; a run of blocks from the shared buffer's (block-scaled:
        // their scales after the blocks).
        std::byte* shared = st_.shared.data(static_cast<int>(me));
        const void* a = count == 1 ? x_.a : shared;
        const float* scales =
            count == 1 ? x_.scales.a : reinterpret_cast<const float*>(agScales(shared, 0));
        auto sc = scalesFor(scales, 0, g.m, 1);
        if (!sc) return sc.status();
        s = st_.gemms->run(g, a, x_.b, x_.c, x_.bias, gemmWs_, stream_, *sc);
      } else {
        auto sc = scalesFor(aScales(0), 0, g.m, 1);
        if (!sc) return sc.status();
        s = sumGemm(g, x_.a, staging_, *sc);
      }
      if (!s) return s;
    }
    return {};
  }

  // A reduce-scatter's GEMM of partial C: the bias on rank 0 alone, so the sum holds it once.
  // Priming, every rank runs rank 0's form, then the others': their shapes differ by the bias, and
  // ranks tuning together must meet the same shapes (Gemms::Agree).
  Status sumGemm(GemmShape g, const void* a, void* out, const GemmScales& scales, int l = 0) {
    const void* bias = comm_.rank() == 0 ? x_.bias : nullptr;
    if (dry_ && x_.bias != nullptr) {
      g.bias = true;
      if (Status s = st_.gemms->run(g, a, x_.b, out, x_.bias, laneWs(l), laneStream(l), scales); !s)
        return s;
      bias = nullptr;
    }
    g.bias = bias != nullptr;
    return st_.gemms->run(g, a, x_.b, out, bias, laneWs(l), laneStream(l), scales);
  }

  // A rank's fused GEMMs (any rank can work out another's), as the plan's copy and block times
  // group them (WEFT_TP_FUSED_BLOCKS: runs of that many blocks at most, whatever the copies cost).
  std::vector<algo::TpPiece> pieces(int rank) const {
    if (plan_.chunks == algo::kTpFusedInPlace) return algo::tpInPlacePieces(comm_.size());
    if (const int most = comm_.config().tpFusedBlocks; most > 0)
      return algo::tpFusedPieces(x_.op, comm_.size(), rank, 0, 1, most);
    return algo::tpFusedPieces(x_.op, comm_.size(), rank, plan_.copyUs, plan_.blockUs);
  }
  std::vector<algo::TpPiece> pieces() const { return pieces(comm_.rank()); }

  // The GEMM of a piece's rows (block-scaled where the call is).
  GemmShape pieceShape(const algo::TpPiece& p) const {
    GemmShape g = chunk(1, 0).shape;
    g.m = rows_ * static_cast<std::size_t>(p.count);
    return g;
  }

  // Chunk i's GEMM (chunkGemm), block-scaled where the call is.
  ChunkGemm chunk(int chunks, int i) const {
    ChunkGemm c = chunkGemm(shape_, x_.type, x_.out, chunks, i);
    c.shape.blockScales = x_.blockScales;
    return c;
  }

  // The scales of a GEMM of `batches` batches of `rows` rows, A's scales of batch b from
  // src + b · srcBatch (the caller's layout): repacked for cuBLASLt on GEMM stream `l` (each
  // runs its GEMMs in turn, so one repacked copy a stream at a time). Per-tensor: as given.
  Result<GemmScales> scalesFor(const float* src, std::size_t srcBatch, std::size_t rows,
                               int batches, int l = 0) {
    if (!x_.blockScales) return x_.scales;
    const std::size_t depth = x_.op == algo::TpOp::allGatherGemm ? x_.k : x_.k / n_;
    const std::size_t each = Gemms::blockScaleFloats(rows, depth);
    float* packed = l == 0 ? packedScales_ : chunkPackedScales_;
    const ScaleRepack r{src, srcBatch, packed, each, rows, blocks_, Gemms::scaleLd(rows), batches};
    if (Status s = repackScales(r, laneStream(l)); !s) return s;
    return GemmScales{packed, tileScales_, each};
  }

 public:
  // A call's GEMMs alone, without its collectives, flags or copies (their results are
  // overwritten by the call): cuBLASLt loads a kernel at its first launch, and loading waits for
  // the kernels running on the device, among them a peer's waiting for this rank. runTp runs it
  // at a call's first shape, then synchronizes and meets the peers before the call itself.
  Status primeGemms(bool fused) {
    dry_ = true;
    // Each shape's first GEMM is here; the ranks tune together (every rank primes alike).
    st_.gemms->setTuning(comm_.config().tpGemmTune, [this](std::vector<float>& v) {
      return comm_.allReduce(v.data(), v.data(), v.size(), DataType::f32, RedOp::max);
    });
    Status s = prepare();
    if (s) {
      s = fused                                ? fusedGemmsOnce()
          : x_.op == algo::TpOp::allGatherGemm ? allGatherGemm()
                                               : gemmReduceScatter();
    }
    st_.gemms->setTuning(false);
    dry_ = false;
    return s;
  }

  // Block-scaled: Bᵀ's tile scales into cuBLASLt's layout, on the caller's stream before any
  // GEMM (they serve the whole call).
  Status prepare() {
    if (!x_.blockScales) return {};
    const ScaleRepack r{
        x_.scales.b, 0,    tileScales_, 0, tileRows(shape_), blocks_, Gemms::tileScaleLd(blocks_),
        1,           false};
    return repackScales(r, stream_);
  }

 private:
  // A chunk's GEMM's: `src` where its first batch's rows start, batches srcBatch apart.
  Result<GemmScales> scalesFor(const ChunkGemm& ch, const float* src, std::size_t srcBatch, int l) {
    const bool whole = ch.shape.batches == 1;
    return scalesFor(src, srcBatch, whole ? ch.shape.m : ch.rows, ch.shape.batches, l);
  }

  // The fused all-gather's buffer: every rank's block of A (its rows), then (block-scaled) every
  // rank's block's scales; rank j's of each at `data`.
  std::size_t agBlockBytes() const { return rows_ * x_.k * es_; }
  std::size_t agScaleBytes() const { return x_.blockScales ? rows_ * blocks_ * sizeof(float) : 0; }
  std::byte* agBlock(std::byte* data, std::size_t j) const { return data + j * agBlockBytes(); }
  std::byte* agScales(std::byte* data, std::size_t j) const {
    return data + n_ * agBlockBytes() + j * agScaleBytes();
  }
  // The in-place all-gather's blocks: every rank's, laid out likewise, in rank 0's buffer after
  // that layout (where no other form's data lies).
  std::byte* inPlaceBlocks(const Shared& sh) const {
    return sh.data(0) + n_ * (agBlockBytes() + agScaleBytes());
  }
  // A's block scales from A's row `row` on (block-scaled; else the call's scales as they are).
  const float* aScales(std::size_t row) const {
    return x_.blockScales ? x_.scales.a + row * blocks_ : x_.scales.a;
  }

  // A fused call's start: its number counted, and the peers done with this rank's buffer in the
  // call before (they copied from it, or into it).
  Status beginFused(const Shared& sh, std::uint64_t timeoutNs) {
    if (Status s = countCall(sh.flag(comm_.rank(), kEpoch), stream_); !s) return s;
    return usersDone(sh, comm_.rank(), timeoutNs, stream_);
  }
  // All-gather: on the side stream (forked from the caller's), once every rank is done with
  // rank `owner`'s buffer in the call before, this rank's block of A and its scales into its slot
  // of the layout at `data` in that buffer (agBlock, agScales), and its "ready" flag raised.
  Status shareOwnBlock(const Shared& sh, int owner, std::byte* data, std::uint64_t timeoutNs) {
    const int me = comm_.rank();
    const auto Me = static_cast<std::size_t>(me);
    if (Status s = follow(st_.side.stream, stream_, st_.side.fork); !s) return s;
    if (Status s = usersDone(sh, owner, timeoutNs, st_.side.stream); !s) return s;
    for (auto [to, from, bytes] :
         {std::tuple{agBlock(data, Me), x_.a, agBlockBytes()},
          std::tuple{agScales(data, Me), static_cast<const void*>(x_.scales.a), agScaleBytes()}}) {
      if (bytes == 0) continue;
      if (cudaError_t e =
              cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, st_.side.stream);
          e != cudaSuccess)
        return cudaFailed("own block", e);
    }
    return raiseFlag(sh.flag(me, kReady), sh.flag(me, kEpoch), st_.side.stream);
  }
  // Where asked for, every rank's block and scales from the layout at `data` into the gathered A
  // and scales, on the caller's stream.
  Status copyGathered(std::byte* data) {
    for (auto [to, from, bytes] : {std::tuple{x_.gathered, data, n_ * agBlockBytes()},
                                   std::tuple{static_cast<void*>(x_.gatheredScales),
                                              agScales(data, 0), n_ * agScaleBytes()}}) {
      if (to == nullptr || bytes == 0) continue;
      if (cudaError_t e = cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream_);
          e != cudaSuccess)
        return cudaFailed("gathered A", e);
    }
    return {};
  }
  // `stream` waits until rank d's buffer is free: every rank is done with it in the call before
  // (d's last call's own use, its sum or GEMMs, and every peer's copies from or into it).
  Status usersDone(const Shared& sh, int d, std::uint64_t timeoutNs, cudaStream_t stream) {
    const int me = comm_.rank();
    FlagList users;
    if (d != me) users.at[users.count++] = sh.flag(d, kFree);
    for (int q = 0; q < comm_.size(); ++q)
      if (q != d) users.at[users.count++] = sh.flag(d, kDone + q);
    return awaitEach(users, sh.flag(me, kEpoch), 1, ~std::uint64_t{0}, timeoutNs, stream);
  }

  // Where ranks share a GPU, a collective's blocks spinning on a peer can hold every SM from the
  // peer's GEMM they wait for (a GEMM's block needs a whole SM): step `step` of the call's
  // collectives starts once every rank's stream has reached it, a one-thread kernel waiting.
  // Elsewhere an empty kernel: the collective is no early (programmatic) dependent of a GEMM.
  Status startGates() {
    return gated_ == nullptr || dry_
               ? Status{}
               : countCall(gated_->flag(comm_.rank(), kGateCount), st_.side.stream);
  }
  Status gate(int step) {
    if (dry_) return {};
    if (gated_ == nullptr) return settle(st_.side.stream);
    const std::uint64_t* count = gated_->flag(comm_.rank(), kGateCount);
    const auto at = static_cast<std::uint64_t>(step);
    if (Status s =
            raiseFlag(gated_->flag(comm_.rank(), kGate), count, st_.side.stream, kGateSteps, at);
        !s)
      return s;
    return awaitEach(gates_, count, kGateSteps, at, timeoutNs_, st_.side.stream);
  }

  // The SMs a GEMM targets (WEFT_TP_GEMM_SMS where a collective runs beside it; 0: all). An
  // all-gather's last GEMM and a reduce-scatter's first run alone.
  int overlapSms(bool overlaps) const { return overlaps ? comm_.config().tpGemmSms : 0; }

  const Shared* gated_;
  bool dry_ = false;  // primeGemms: the GEMMs alone
  std::uint64_t timeoutNs_;
  FlagList gates_;
  Communicator& comm_;
  const TpCall& x_;
  const algo::TpPlan& plan_;
  State& st_;
  std::byte* gemmWs_;
  std::byte* staging_;
  float* gatheredScales_;
  float* packedScales_;
  float* chunkPackedScales_;  // the second GEMM stream's repacked scales
  float* tileScales_;
  std::size_t n_;
  algo::TpShape shape_;
  std::size_t rows_, blocks_;  // a rank's block of rows; A's scales a row (block-scaled fp8)
  std::size_t es_, cs_;        // A's value size, C's
  cudaStream_t stream_;
  int gemmStreams_;
};

}  // namespace

Status runTp(Communicator& comm, const TpCall& x) {
  if (Status s = checkTp(x, comm.size(), gemmStreams(comm.config(), x.op)); !s) return s;
  for (auto [p, role] : {std::pair<const void*, const char*>{x.a, "A"},
                         {x.b, "B"},
                         {x.c, "C"},
                         {x.gathered, "the gathered A"},
                         {x.bias, "the bias"},
                         {x.scales.a, "A's scale"},
                         {x.scales.b, "B's scale"},
                         {x.gatheredScales, "the gathered scales"},
                         {x.workspace, "the workspace"}}) {
    if (Status s = onDevice(p, "tensor-parallel call", role); !s) return s;
  }
  auto plan = comm.tpPlanFor(x.shape(comm.size()));
  if (!plan) return plan.status();
  auto layout = workspaceLayout(x.shape(comm.size()), gemmStreams(comm.config(), x.op));
  if (!layout) return layout.status();
  auto workspace = workspaceOr(comm, x.workspace, layout->total);
  if (!workspace) return workspace.status();
  std::byte* ws = *workspace;
  auto st = stateOf(comm);
  if (!st) return st.status();
  const algo::TpPlan& how = *plan;
  // The flags (and a fused call's data) every rank maps; where the ranks cannot map them (every
  // rank alike), ungated.
  bool mapped = false;
  if (comm.size() > 1 && comm.size() <= kFusedMaxRanks) {
    const algo::TpShape shape = x.shape(comm.size());
    // all-gather's block scales after the blocks; in place, rank 0's buffer holds them twice
    // (Run::inPlaceBlocks).
    const std::size_t agData = x.m * x.k * shape.commBytes() +
                               (x.blockScales ? x.m * scaleBlocks(shape) * sizeof(float) : 0);
    const std::size_t data = !algo::tpFused(how.chunks)          ? 0
                             : x.op != algo::TpOp::allGatherGemm ? x.m * x.cols * shape.commBytes()
                             : how.chunks == algo::kTpFusedInPlace ? 2 * agData
                                                                   : agData;
    auto ok = ensureShared(comm, **st, kFlagsBytes + data, static_cast<cudaStream_t>(x.stream));
    if (!ok) return ok.status();
    mapped = *ok;
  }
  // The selector plans fused only where the ranks map each other's memory (one host).
  const bool fused = algo::tpFused(how.chunks);
  if (fused && !mapped)
    return Status(Code::internalError,
                  "tensor-parallel call: planned fused, but the ranks cannot map each other's "
                  "buffers");
  const Shared* gated =
      !fused && mapped && (*st)->shared.peers.deviceShared ? &(*st)->shared : nullptr;
  const auto timeoutNs =
      static_cast<std::uint64_t>(comm.config().timeout.count()) * std::uint64_t{1000000};
  Run run(comm, x, how, **st, ws, *layout, gated, timeoutNs);
  // Where ranks wait for each other on the device, a call's first shape runs its GEMMs first,
  // then every rank meets the others (outside a capture; within one, a call of the shape must
  // have run before, as for the shared buffer).
  const auto key =
      std::make_tuple(static_cast<int>(x.op), x.m, x.cols, x.k, static_cast<int>(x.type),
                      static_cast<int>(x.out), x.bias != nullptr, x.blockScales, how.chunks);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(static_cast<cudaStream_t>(x.stream), &capture);
      e != cudaSuccess)
    return cudaFailed("capture status", e);
  if (mapped && capture == cudaStreamCaptureStatusNone && !(*st)->primed.contains(key)) {
    if (Status s = run.primeGemms(fused); !s) return s;
    if (cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(x.stream));
        e != cudaSuccess)
      return cudaFailed("sync", e);
    if (Status s = comm.barrier(); !s) return s;
    (*st)->primed.insert(key);
  }
  // One operation of the communicator's order: a later call on any stream waits for its GEMMs
  // too, not just its collectives.
  return comm.gpuOperation(x.stream, [&] {
    if (Status s = run.prepare(); !s) return s;
    const bool ag = x.op == algo::TpOp::allGatherGemm;
    if (how.chunks == algo::kTpFusedInPlace)
      return ag ? run.allGatherGemmInPlace((*st)->shared, timeoutNs)
                : run.gemmReduceScatterInPlace((*st)->shared, timeoutNs);
    if (fused)
      return ag ? run.allGatherGemmFused((*st)->shared, timeoutNs)
                : run.gemmReduceScatterFused((*st)->shared, timeoutNs);
    return x.op == algo::TpOp::allGatherGemm ? run.allGatherGemm() : run.gemmReduceScatter();
  });
}

}  // namespace weft::fused::tp
