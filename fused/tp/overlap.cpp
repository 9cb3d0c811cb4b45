#include "fused/tp/overlap.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace weft::fused::tp {
namespace {

constexpr std::size_t kAlign = 256;
constexpr std::size_t kGemmWorkspaceBytes = std::size_t{32} << 20;  // gemm.hpp's

std::size_t aligned(std::size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// a · b · c, or nullopt past size_t.
std::optional<std::size_t> product(std::size_t a, std::size_t b, std::size_t c) {
  constexpr std::size_t most = std::numeric_limits<std::size_t>::max();
  if (a != 0 && b > most / a) return std::nullopt;
  if (a * b != 0 && c > most / (a * b)) return std::nullopt;
  return a * b * c;
}

}  // namespace

ChunkGemm chunkGemm(const algo::TpShape& s, DataType type, DataType out, int chunks, int i) {
  const auto n = static_cast<std::size_t>(s.nranks);
  const std::size_t block = s.m / n;
  ChunkGemm c;
  for (int j = 0; j < i; ++j) c.start += s.chunkRows(chunks, j);
  c.rows = s.chunkRows(chunks, i);
  c.first = c.start;
  GemmShape& g = c.shape;
  g.type = type;
  g.out = out;
  g.bTransposed = type == DataType::f8e4m3;
  std::size_t ldc = 0, strideA = 0, strideC = 0;
  if (s.op == algo::TpOp::allGatherGemm) {
    // A: the chunk's staged rows, rank by rank; C: rank j's rows at j·block + first, step apart.
    g.n = s.cols / n;
    g.k = s.k;
    if (chunks > 1 && c.rows * static_cast<std::size_t>(chunks) == block) {
      c.first = static_cast<std::size_t>(i);
      c.step = static_cast<std::size_t>(chunks);
    }
    c.aOffset = c.start * n * s.k;
    c.cOffset = c.first * g.n;
    ldc = c.step * g.n;
    strideA = c.rows * s.k;
    strideC = block * g.n;
  } else {
    // A: rows j·block + start; C: the chunk's staged partial rows, rank by rank.
    g.n = s.cols;
    g.k = s.k / n;
    c.aOffset = c.start * g.k;
    c.cOffset = c.start * n * s.cols;
    ldc = s.cols;
    strideA = block * g.k;
    strideC = c.rows * s.cols;
  }
  g.lda = g.k;
  g.ldb = g.bTransposed ? g.k : g.n;
  g.ldc = ldc;
  if (c.rows == block || c.step > 1) {
    g.m = c.rows * n;
  } else {
    g.m = c.rows;
    g.batches = static_cast<int>(n);
    g.strideA = strideA;
    g.strideC = strideC;
  }
  return c;
}

std::size_t scaleBlocks(const algo::TpShape& s) {
  const std::size_t depth =
      s.op == algo::TpOp::allGatherGemm ? s.k : s.k / static_cast<std::size_t>(s.nranks);
  return (depth + 127) / 128;
}

std::size_t tileRows(const algo::TpShape& s) {
  const std::size_t rows =
      s.op == algo::TpOp::allGatherGemm ? s.cols / static_cast<std::size_t>(s.nranks) : s.cols;
  return (rows + 127) / 128;
}

int gemmStreams(const Config& config, algo::TpOp op) {
  if (config.tpGemmStreams > 0) return std::min(config.tpGemmStreams, kTpMostGemmStreams);
  return op == algo::TpOp::gemmReduceScatter ? 2 : 1;
}

Result<TpWorkspace> workspaceLayout(const algo::TpShape& s, int gemmStreams) {
  const auto n = static_cast<std::size_t>(s.nranks);
  const auto streams = static_cast<std::size_t>(std::clamp(gemmStreams, 1, kTpMostGemmStreams));
  const auto staging =
      product(s.m, s.op == algo::TpOp::allGatherGemm ? s.k : s.cols, s.commBytes());
  // fp8's block scales: every rank's rows' (gathered), then repacked as batches of rows, each
  // padded to 16 bytes (Gemms::blockScaleFloats): the whole call's, and on a second GEMM stream
  // its chunks' (half a block's rows at most, rounded up).
  const std::size_t blocks = s.valueBytes == 1 ? scaleBlocks(s) : 0;
  const auto gathered = product(s.m, blocks, sizeof(float));
  const auto packed = product(s.m + 4 * n, blocks + 1, sizeof(float));
  const auto chunkPacked = product(s.m / 2 + 5 * n, blocks + 1, sizeof(float));
  const auto tiles = product(tileRows(s), Gemms::tileScaleLd(blocks), sizeof(float));
  constexpr std::size_t most = std::numeric_limits<std::size_t>::max() / 8;
  if (!staging || !gathered || !packed || !chunkPacked || !tiles || *staging > most ||
      *gathered > most || *packed > most || *chunkPacked > most || *tiles > most)
    return invalidArgument("a " + std::to_string(s.m) + "x" + std::to_string(s.cols) + "x" +
                           std::to_string(s.k) + " GEMM is too large to stage");
  TpWorkspace w;
  w.staging = streams * kGemmWorkspaceBytes;
  w.gatheredScales = w.staging + aligned(*staging);
  w.packedScales = w.gatheredScales + (blocks == 0 ? 0 : aligned(*gathered));
  w.chunkPackedScales = w.packedScales + (blocks == 0 ? 0 : aligned(*packed));
  w.tileScales = w.chunkPackedScales + (blocks == 0 || streams == 1 ? 0 : aligned(*chunkPacked));
  w.total = w.tileScales + (blocks == 0 ? 0 : aligned(*tiles));
  return w;
}

Result<std::size_t> workspaceBytes(const algo::TpShape& s, int gemmStreams) {
  auto w = workspaceLayout(s, gemmStreams);
  if (!w) return w.status();
  return w->total;
}

Status checkTp(const TpCall& x, int nranks, int gemmStreams) {
  const std::string what(x.op == algo::TpOp::allGatherGemm ? "weftAllGatherGemm"
                                                           : "weftGemmReduceScatter");
  if (!Gemms::supports(x.type, x.out))
    return invalidArgument(what + ": " + std::string(name(x.type)) + " into " +
                           std::string(name(x.out)) +
                           " is not multiplied here (bf16, f16 and f32 into their own type are, "
                           "and f8e4m3 into bf16 or f16)");
  if (x.m == 0 || x.cols == 0 || x.k == 0)
    return invalidArgument(what + ": m, n and k must be positive (got " + std::to_string(x.m) +
                           ", " + std::to_string(x.cols) + ", " + std::to_string(x.k) + ")");
  const auto n = static_cast<std::size_t>(nranks);
  auto divides = [&](std::size_t v, const char* dim, const char* role) -> Status {
    if (v % n == 0) return {};
    return invalidArgument(what + ": " + dim + " = " + std::to_string(v) + " (" + role +
                           ") does not divide among " + std::to_string(n) + " ranks");
  };
  const bool ag = x.op == algo::TpOp::allGatherGemm;
  if (Status s = divides(x.m, "m", ag ? "A's rows, gathered" : "C's rows, scattered"); !s) return s;
  if (Status s = ag ? divides(x.cols, "n", "B's and C's columns, split")
                    : divides(x.k, "k", "A's columns and B's rows, split");
      !s)
    return s;
  if (x.type != DataType::f8e4m3 &&
      (x.scales.a != nullptr || x.scales.b != nullptr || x.blockScales))
    return invalidArgument(what + ": scales apply to fp8 operands only");
  if (x.blockScales && (x.scales.a == nullptr || x.scales.b == nullptr))
    return invalidArgument(what + ": block-scaled fp8 needs A's and B's scales (NULL given)");
  if (x.blockScales && (x.m / n) % 4 != 0)
    return invalidArgument(
        what + ": block-scaled fp8 needs each rank's rows (m/s = " + std::to_string(x.m / n) +
        ") to be a multiple of 4 (cuBLASLt runs no such GEMM otherwise)");
  if (x.gatheredScales != nullptr && (!ag || !x.blockScales))
    return invalidArgument(what +
                           ": only a block-scaled all-gather + GEMM returns the gathered scales");
  // cuBLASLt's fp8 GEMMs refuse operands, outputs and scales that are not 16-byte aligned, and
  // rows of C that are not ("not supported", at the GEMM: a rank failing mid-call would strand
  // its peers). C's rows of 8 values keep every block's and chunk's C aligned too.
  if (x.type == DataType::f8e4m3) {
    for (const void* p :
         {static_cast<const void*>(x.a), x.b, static_cast<const void*>(x.c),
          static_cast<const void*>(x.gathered), x.bias, static_cast<const void*>(x.scales.a),
          static_cast<const void*>(x.scales.b), static_cast<const void*>(x.gatheredScales)}) {
      if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
        return invalidArgument(
            what +
            ": fp8 calls need A, B, C, the gathered A, the bias and the scales "
            "(and the gathered scales) at addresses that are multiples of 16 bytes");
    }
    const std::size_t cRow = ag ? x.cols / n : x.cols;
    if (cRow % 8 != 0)
      return invalidArgument(what + ": fp8 needs C's rows (" + std::to_string(cRow) +
                             " values) to be a multiple of 8");
    // The operands are read along k, whose rows must be 16-byte aligned too.
    const std::size_t depth = ag ? x.k : x.k / n;
    if (depth % 16 != 0)
      return invalidArgument(what + ": fp8 needs each rank's k (" + std::to_string(depth) +
                             ") to be a multiple of 16");
  }
  if (x.a == nullptr || x.b == nullptr || x.c == nullptr)
    return invalidArgument(what + ": A, B and C must not be NULL");
  if (x.gathered != nullptr && !ag)
    return invalidArgument(what + ": only all-gather + GEMM returns a gathered A");
  auto need = workspaceBytes(x.shape(nranks), gemmStreams);
  if (!need) return Status(need.status().code(), what + ": " + need.status().message());
  if (x.workspace == nullptr && x.workspaceBytes != 0)
    return invalidArgument(what + ": workspace is NULL but workspaceBytes is " +
                           std::to_string(x.workspaceBytes));
  if (x.workspace != nullptr && x.workspaceBytes < *need)
    return invalidArgument(what + ": a workspace of " + std::to_string(x.workspaceBytes) +
                           " bytes is too small: this shape needs " + std::to_string(*need) +
                           " (weftTpWorkspaceSize)");
  return {};
}

}  // namespace weft::fused::tp
