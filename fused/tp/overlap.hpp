// Tensor-parallel GEMMs with their collective (weft.h's weftAllGatherGemm and
// weftGemmReduceScatter), on GPU memory, stream-ordered and capturable in a CUDA graph:
//   all-gather + GEMM:     C [m, cols/n] = allgather(A shards [m/n, k]) · B [k, cols/n]
//   GEMM + reduce-scatter: C [m/n, cols] = reducescatter(A [m, k/n] · B [k/n, cols])
// run unfused (the collective, then one GEMM; or the reverse) or in k chunks of every rank's
// rows: chunk c's all-gather (on a side stream) overlaps chunk c-1's GEMM (on the caller's), or
// chunk c's reduce-scatter overlaps chunk c+1's GEMM. The selector prices both
// (algo::Selector::planTp); the GEMMs are cuBLASLt's (gemm.hpp), the collectives the
// communicator's own. docs/algorithms-fused.md, "Tensor-parallel overlap".
#pragma once

#include <cstddef>

#include "algorithms/overlap.hpp"
#include "fused/tp/gemm.hpp"
#include "src/core/communicator.hpp"

namespace weft::fused::tp {

struct TpCall {
  algo::TpOp op = algo::TpOp::allGatherGemm;
  const void* a = nullptr;     // this rank's A (its rows, for all-gather; its columns, for RS)
  const void* b = nullptr;     // this rank's B
  void* c = nullptr;           // this rank's C
  void* gathered = nullptr;    // all-gather: where the gathered A goes as well (optional)
  const void* bias = nullptr;  // cols/n (all-gather) or cols (RS) values added to every row
  std::size_t m = 0, cols = 0, k = 0;  // the whole GEMM's shape
  DataType type = DataType::bf16;      // A's and B's
  DataType out = DataType::bf16;       // C's and the bias's: type's, or bf16/f16 for f8e4m3
  GemmScales scales;                   // f8e4m3's (B given as Bᵀ then: gemm.hpp)
  // f8e4m3's scales per block: scales.a row-major, one f32 per 128 values along k of each of
  // this rank's rows of A; scales.b one per 128 × 128 tile of this rank's Bᵀ, row-major.
  bool blockScales = false;
  float* gatheredScales = nullptr;  // all-gather, block scales: the gathered A's (optional)
  void* workspace = nullptr;        // null: the communicator's
  std::size_t workspaceBytes = 0;
  void* stream = nullptr;

  algo::TpShape shape(int nranks) const {
    return {op, m, cols, k, sizeOf(type), nranks, sizeOf(out), blockScales ? std::size_t{4} : 1};
  }
};

// Chunk i of `chunks` of a call's GEMM: its shape, where its A and C start (in values: in the
// staged gathered A and in C for all-gather; in A and in the staged partial C for
// reduce-scatter), the rows of each block staged before it (start), and which of each block's
// rows it holds: `rows` of them, `step` apart from row `first`. An all-gather's chunks take
// every chunks-th row of each block where the blocks divide evenly (step = chunks, first = i):
// the chunk's C rows are then `step` apart throughout, one GEMM of all its rows. Elsewhere a
// chunk holds consecutive rows of each block (step 1, first = start): a batch of one GEMM a
// block, or one GEMM of every block where it holds them whole.
struct ChunkGemm {
  GemmShape shape;
  std::size_t aOffset = 0, cOffset = 0;
  std::size_t start = 0, rows = 0;
  std::size_t first = 0, step = 1;
};
// A's and B's type `type`, C's `out` (fp8 A and B: B given as Bᵀ).
ChunkGemm chunkGemm(const algo::TpShape& shape, DataType type, DataType out, int chunks, int i);

// The workspace a call of this shape needs, whatever it picks: cuBLASLt's (one a GEMM stream,
// WEFT_TP_GEMM_STREAMS), the staging of every rank's rows (the gathered A, or the GEMM's partial
// C), and for fp8 the gathered block scales and their repacking for cuBLASLt (gemm.hpp; on the
// second GEMM stream its chunks' apart); byte offsets, cuBLASLt's first.
constexpr int kTpMostGemmStreams = 2;
// The GEMM streams a chunked call of `op` takes in turn: WEFT_TP_GEMM_STREAMS where set; else
// two for GEMM + reduce-scatter (its chunked:4 call ran 5-13 % faster) and one for all-gather +
// GEMM (its calls no faster, its chunks' GEMMs slower): docs/perf-tp-gemms.md, "two streams".
int gemmStreams(const Config& config, algo::TpOp op);
// The GEMM stream of a chunked call's chunk i (0: the caller's): the streams in turn.
inline int gemmLane(int gemmStreams, int chunks, int i) {
  return gemmStreams > 1 && chunks > 1 ? i % gemmStreams : 0;
}
struct TpWorkspace {
  std::size_t staging = 0, gatheredScales = 0, packedScales = 0, chunkPackedScales = 0,
              tileScales = 0, total = 0;
};
Result<TpWorkspace> workspaceLayout(const algo::TpShape& shape, int gemmStreams);
Result<std::size_t> workspaceBytes(const algo::TpShape& shape, int gemmStreams);
// The 128-value blocks along k of a rank's rows of A; of 128 rows of its Bᵀ.
std::size_t scaleBlocks(const algo::TpShape& shape);
std::size_t tileRows(const algo::TpShape& shape);
// Shapes that divide among the ranks, a type cuBLASLt multiplies, buffers given, a workspace
// large enough: what a call checks before it changes anything.
Status checkTp(const TpCall& call, int nranks, int gemmStreams);
// Checks and runs `call` as the communicator's plan for its shape says.
Status runTp(Communicator& comm, const TpCall& call);

}  // namespace weft::fused::tp
