// The tensor-parallel operations (fused/tp) as the selector prices them: an all-gather of the
// rows of A before a GEMM, or a reduce-scatter of a GEMM's rows after it, run one after the
// other (unfused) or cut into k chunks of every rank's rows, chunk c's collective overlapping
// chunk c-1's (or c+1's) GEMM. docs/algorithms-fused.md, "Tensor-parallel overlap".
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "algorithms/tuner.hpp"

namespace weft::algo {

enum class TpOp : std::uint8_t {
  allGatherGemm,      // C = allgather(A) · B: A [m/n, k] a rank, B [k, cols/n], C [m, cols/n]
  gemmReduceScatter,  // C = reducescatter(A · B): A [m, k/n], B [k/n, cols], C [m/n, cols]
};
std::string_view name(TpOp op);

// The GEMM's whole shape (m × cols × k, as if on one rank), ranks and value sizes: A's and B's
// (1: fp8, multiplied at the fp8 rate), and C's (0: the same).
struct TpShape {
  TpOp op = TpOp::allGatherGemm;
  std::size_t m = 0, cols = 0, k = 0;
  std::size_t valueBytes = 2;
  int nranks = 1;
  std::size_t outBytes = 0;
  // Rows a GEMM takes in multiples of (block-scaled fp8: 4); a rank's rows are a multiple.
  std::size_t rowGrain = 1;
  std::size_t cBytes() const { return outBytes != 0 ? outBytes : valueBytes; }
  // The bytes of the collective's values: A's rows (all-gather) or C's (reduce-scatter).
  std::size_t commBytes() const { return op == TpOp::allGatherGemm ? valueBytes : cBytes(); }
  // Rows of one rank's block (m / nranks) in chunk c of `chunks`, whole grains: the first take
  // one more; the most chunks that cut it (a grain each).
  std::size_t chunkRows(int chunks, int c) const;
  std::size_t mostChunks() const;
};

// TpPlan::chunks of the fused variants, ranks that map each other's memory: all-gather + GEMM
// copies each rank's block from its owner by the copy engine as the GEMMs of the blocks before
// it run (own block first); GEMM + reduce-scatter copies each finished partial block to its
// owner as the next block's GEMM runs (own block last), then sums the n blocks. No SM moves data.
inline constexpr int kTpFused = -1;
// The fused variant for ranks sharing a device (their memory is its memory), one GEMM of every
// row (tpInPlacePieces): all-gather + GEMM puts every rank's block into one buffer and multiplies
// them where they lie (one copy a block, no replica a rank); GEMM + reduce-scatter writes each
// rank's partial C into its own buffer and each rank sums its block from every rank's buffer.
inline constexpr int kTpFusedInPlace = -2;
inline bool tpFused(int chunks) {
  return chunks == kTpFused || chunks == kTpFusedInPlace;
}
// The most ranks the fused variants serve (a flag a peer in each rank's buffer).
inline constexpr int kTpFusedMaxRanks = 128;

struct TpPlan {
  int chunks = 1;  // 1: unfused; kTpFused, kTpFusedInPlace: fused
  double estimateUs = 0;
  // Fused: one rank's block's copy by the copy engine and its GEMM, as priced (tpFusedPieces).
  double copyUs = 0, blockUs = 0;
  double sequentialUs = 0;        // the GEMM, then the collective (or the reverse), unchunked
  double gemmUs = 0, commUs = 0;  // unchunked, each alone
  Plan comm;                      // one chunk's collective
  std::string reason;
  std::string name() const;  // "unfused", "chunked:4", "fused", "fused:inplace"
};

// A fused call's GEMM of whole blocks at once: the rows of ranks first .. first + count - 1.
struct TpPiece {
  int first = 0, count = 1;
  bool operator==(const TpPiece&) const = default;
};

// One rank's fused GEMMs in the order it runs them. All-gather + GEMM: its own block, then the
// blocks after it, then those before it; each GEMM takes every block of its run whose copy (in
// that order, copyUs each) the GEMMs before it hide. GEMM + reduce-scatter: the same runs, its
// own block last; each GEMM takes as many blocks as the GEMM after it hides the copies of. Copies
// far cheaper than a block's GEMM: three GEMMs at most; as dear: a block each. `most`: no GEMM
// takes more blocks (0: any number).
std::vector<TpPiece> tpFusedPieces(TpOp op, int nranks, int rank, double copyUs, double blockUs,
                                   int most = 0);

// A rank's in-place GEMMs (kTpFusedInPlace), either operation: one of every rank's block. On one
// H100 four ranks' GEMMs a block (1024 rows each) took 7-11 % longer than one of every row
// (docs/perf-tp.md, "In place on one GPU").
std::vector<TpPiece> tpInPlacePieces(int nranks);

// "unfused" (1), "chunked:K", "fused" (kTpFused), "fused:inplace" (kTpFusedInPlace); an error
// names the forms.
Result<int> parseTpChunks(std::string_view text);

}  // namespace weft::algo
