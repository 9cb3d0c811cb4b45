#include "fused/tp/gemm.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fused/tp/tiles.hpp"
#include "src/core/log.hpp"
#include "topology/shared_library.hpp"

namespace weft::fused::tp {
namespace {

// cuBLASLt's entry points, bound once for the process.
struct Lt {
  topo::SharedLibrary library;
  // clang-format off
#define WEFT_LT_FUNCTIONS(X)                                                              \
  X(cublasLtCreate) X(cublasLtDestroy)                                                    \
  X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy)                                \
  X(cublasLtMatmulDescSetAttribute)                                                       \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)                            \
  X(cublasLtMatrixLayoutSetAttribute)                                                     \
  X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)                    \
  X(cublasLtMatmulPreferenceSetAttribute)                                                 \
  X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulAlgoConfigGetAttribute)              \
  X(cublasLtMatmulAlgoInit) X(cublasLtMatmulAlgoCapGetAttribute)                          \
  X(cublasLtMatmulAlgoConfigSetAttribute) X(cublasLtMatmulAlgoCheck)                      \
  X(cublasLtMatmul) X(cublasLtGetStatusString)
  // clang-format on
#define WEFT_LT_POINTER(f) decltype(&::f) f = nullptr;
  WEFT_LT_FUNCTIONS(WEFT_LT_POINTER)
#undef WEFT_LT_POINTER
};

Result<const Lt*> loadLt() {
  static std::once_flag once;
  static Lt lt;
  static Status loaded;
  std::call_once(once, [] {
    const std::string major = std::to_string(CUBLAS_VER_MAJOR);
    auto lib = topo::SharedLibrary::open("libcublasLt.so." + major, "cuBLASLt");
    if (!lib) lib = topo::SharedLibrary::open("libcublasLt.so", "cuBLASLt");
    if (!lib) {
      loaded = lib.status();
      return;
    }
    lt.library = std::move(*lib);
#define WEFT_LT_BIND(f)                                                                           \
  if (!lt.library.bind(#f, lt.f)) {                                                               \
    loaded = Status(Code::unsupported, "cuBLASLt lacks " #f " (CUDA " + major + "'s is needed)"); \
    return;                                                                                       \
  }
    WEFT_LT_FUNCTIONS(WEFT_LT_BIND)
#undef WEFT_LT_BIND
  });
  if (!loaded) return loaded;
  return &lt;
}

cudaDataType_t cudaType(DataType t) {
  switch (t) {
    case DataType::bf16:
      return CUDA_R_16BF;
    case DataType::f16:
      return CUDA_R_16F;
    case DataType::f8e4m3:
      return CUDA_R_8F_E4M3;
    default:
      return CUDA_R_32F;
  }
}

Status ltError(const Lt& lt, const char* what, cublasStatus_t s) {
  return Status(Code::systemError,
                std::string("cuBLASLt ") + what + ": " + lt.cublasLtGetStatusString(s));
}

// The heuristic's results a shape's tuning times: its second or third took 10-19 % less time
// than its first where four ranks shared an H100 (docs/perf-tp-gemms.md, "Tuning cuBLASLt's
// algorithm").
constexpr std::size_t kCandidates = 8;

// One of an algorithm's configuration attributes, read as `fallback`'s type (`fallback` where
// cuBLASLt does not say).
template <typename T>
T configValue(const Lt& lt, const cublasLtMatmulAlgo_t& algo,
              cublasLtMatmulAlgoConfigAttributes_t attribute, T fallback) {
  std::size_t written = 0;
  lt.cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &fallback, sizeof(fallback), &written);
  return fallback;
}

// The heuristic offers tiles of a few sizes, whose last wave may run nearly empty: 2048 × 7168
// rows of 320 × 128 tiles are 2.79 waves of an H100's 132 SMs. Tuning also times the heuristic
// first's algorithm with the kFittedTiles tiles that leave the least idle (fittedTiles) and with
// its own tile, each with every cluster of kClusters and kernel option (docs/perf-tp-gemms.md,
// "Wave-fitted tiles").
constexpr std::size_t kFittedTiles = 4;
constexpr std::int32_t kMaxOption = 7;
// Each cuBLASLt shape, and its x × y tiles (x along the tiles' rows).
constexpr std::array<std::tuple<std::uint16_t, int, int>, 3> kClusters = {{
    {CUBLASLT_CLUSTER_SHAPE_1x1x1, 1, 1},
    {CUBLASLT_CLUSTER_SHAPE_2x1x1, 2, 1},
    {CUBLASLT_CLUSTER_SHAPE_1x2x1, 1, 2},
}};

// A cluster shape's {x, y}; {0, 0} for one fitting does not use.
std::pair<int, int> clusterSides(std::uint16_t shape) {
  for (auto [s, x, y] : kClusters)
    if (s == shape) return {x, y};
  return {0, 0};
}

// The cluster shape of x × y tiles (one fitting uses; else cuBLASLt's choice).
std::uint16_t clusterOf(int x, int y) {
  for (auto [s, sx, sy] : kClusters)
    if (sx == x && sy == y) return s;
  return CUBLASLT_CLUSTER_SHAPE_AUTO;
}

}  // namespace

// A shape's descriptors: the row-major C = A·B is cuBLASLt's column-major Cᵀ = Bᵀ·Aᵀ, so its
// first operand is B (n × k, leading dimension ldb; a given Bᵀ is k × n, transposed), its second
// A (k × m, lda), D is n × m.
struct Gemms::Cached {
  const Lt* lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t b = nullptr, a = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // Until the shape's first GEMM chose: the heuristic's candidates without split-K, best first,
  // then (where it may choose another) the wave-fitted ones.
  std::vector<cublasLtMatmulAlgo_t> candidates;
  int offered = 0;  // how many there were
  int chosen = 0;   // which of them `algo` is
  int tile = -1;    // `algo`'s tile id, once chosen
  ~Cached() {
    if (lt == nullptr) return;
    if (c != nullptr) lt->cublasLtMatrixLayoutDestroy(c);
    if (a != nullptr) lt->cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) lt->cublasLtMatrixLayoutDestroy(b);
    if (desc != nullptr) lt->cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

// The SMs a GEMM of `s` has: its target, else the current device's.
int smsOf(const GemmShape& s) {
  if (s.smCount > 0) return s.smCount;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  return sms;
}

// The heuristic first's algorithm as tuning and fitting vary it: its id's defaults, its
// stages, tile, cluster and kernel option, and the tiles it offers, on the shape's SMs.
struct Variations {
  cublasLtMatmulAlgo_t base{};  // the algorithm with its defaults, each configuration a copy
  std::uint32_t stages = 0, option = 0;
  std::uint16_t cluster = 0;
  std::uint32_t options = 0;  // its most kernel option, kMaxOption at most
  const TileSize* own = nullptr;
  std::vector<TileSize> offered;
  int sms = 0;
};

std::optional<Variations> variationsOf(const Lt& lt, cublasLtHandle_t handle, const GemmShape& s,
                                       const cublasLtMatmulAlgo_t& first) {
  Variations v;
  v.sms = smsOf(s);
  std::size_t bytes = 0;
  if (v.sms <= 0 ||
      lt.cublasLtMatmulAlgoCapGetAttribute(&first, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0,
                                           &bytes) != CUBLAS_STATUS_SUCCESS)
    return std::nullopt;
  std::vector<std::uint32_t> ids(bytes / sizeof(std::uint32_t));
  if (ids.empty() ||
      lt.cublasLtMatmulAlgoCapGetAttribute(&first, CUBLASLT_ALGO_CAP_TILE_IDS, ids.data(), bytes,
                                           &bytes) != CUBLAS_STATUS_SUCCESS)
    return std::nullopt;
  for (std::uint32_t id : ids)
    if (const TileSize* t = tileSize(id)) v.offered.push_back(*t);
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attribute, auto fallback) {
    return configValue(lt, first, attribute, fallback);
  };
  v.own = tileSize(get(CUBLASLT_ALGO_CONFIG_TILE_ID, std::uint32_t{0}));
  v.stages = get(CUBLASLT_ALGO_CONFIG_STAGES_ID, std::uint32_t{0});
  v.cluster = get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, std::uint16_t{0});
  v.option = get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, std::uint32_t{0});
  std::int32_t options = 0;
  lt.cublasLtMatmulAlgoCapGetAttribute(&first, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &options,
                                       sizeof(options), &bytes);
  v.options = static_cast<std::uint32_t>(std::clamp(options, 0, kMaxOption));
  const cudaDataType_t t = cudaType(s.type), out = cudaType(s.out);
  if (lt.cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, t, t, out, out,
                                get(CUBLASLT_ALGO_CONFIG_ID, std::int32_t{0}),
                                &v.base) != CUBLAS_STATUS_SUCCESS)
    return std::nullopt;
  return v;
}

// `v`'s algorithm with a tile, cluster and kernel option, where cuBLASLt accepts it for the
// shape within the workspace.
std::optional<cublasLtMatmulAlgo_t> configured(const Lt& lt, cublasLtHandle_t handle,
                                               const Gemms::Cached& d, const Variations& v,
                                               const TileSize& tile, std::uint16_t cluster,
                                               std::uint32_t option) {
  cublasLtMatmulAlgo_t algo = v.base;
  lt.cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile.id,
                                          sizeof(tile.id));
  lt.cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &v.stages,
                                          sizeof(v.stages));
  lt.cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                          sizeof(cluster));
  lt.cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &option,
                                          sizeof(option));
  cublasLtMatmulHeuristicResult_t checked{};
  if (lt.cublasLtMatmulAlgoCheck(handle, d.desc, d.b, d.a, d.c, d.c, &algo, &checked) !=
          CUBLAS_STATUS_SUCCESS ||
      checked.workspaceSize > Gemms::kWorkspaceBytes)
    return std::nullopt;
  return algo;
}

// Appends the wave-fitted configurations of `first`'s algorithm that cuBLASLt accepts for the
// shape (see kFittedTiles), to the candidates tuning times.
void fitted(const Lt& lt, cublasLtHandle_t handle, Gemms::Cached& d, const GemmShape& s,
            const cublasLtMatmulAlgo_t& first) {
  const std::optional<Variations> v = variationsOf(lt, handle, s, first);
  if (!v) return;
  std::vector<TileSize> ranked = fittedTiles(v->offered, s.m, s.n, s.batches, v->sms, kFittedTiles);
  if (v->own != nullptr && std::find(ranked.begin(), ranked.end(), *v->own) == ranked.end())
    ranked.push_back(*v->own);
  for (const TileSize& tile : ranked)
    for (const auto& cluster : kClusters)
      for (std::uint32_t option = 0; option <= v->options; ++option)
        if (auto algo = configured(lt, handle, d, *v, tile, std::get<0>(cluster), option))
          d.candidates.push_back(*algo);
}

// Untuned: the heuristic first's algorithm with the least idle tile cuBLASLt accepts of those
// that fit the shape's SMs better than its own by kFitGain (fitsBetter). First with its own
// cluster shape and kernel option, where that cluster pairs the tile along its shorter side
// (pairsShorterSide); else, where the heuristic clusters two tiles or more, the largest such
// tile (largestFirst) paired along its shorter side, with the lowest kernel option it accepts.
// None where there is none. Other configurations took 0.9-1.4 × the heuristic's time; paired
// so, a fitted tile's highest option 1.00-1.02 × its lowest, sustained at 2 and 4 ranks
// (docs/perf-tp-gemms.md, "Wave-fitted tiles, untuned", "Every configuration, sustained" and
// "The rule as built, every cell").
std::optional<cublasLtMatmulAlgo_t> fittedUntuned(const Lt& lt, cublasLtHandle_t handle,
                                                  const Gemms::Cached& d, const GemmShape& s,
                                                  const cublasLtMatmulAlgo_t& first) {
  const std::optional<Variations> v = variationsOf(lt, handle, s, first);
  if (!v || v->own == nullptr) return std::nullopt;
  const std::vector<TileSize> better =
      fitsBetter(fittedTiles(v->offered, s.m, s.n, s.batches, v->sms, kFittedTiles), *v->own, s.m,
                 s.n, s.batches, v->sms);
  const auto [x, y] = clusterSides(v->cluster);
  for (const TileSize& tile : better) {
    if (!pairsShorterSide(tile, x, y)) continue;
    if (auto algo = configured(lt, handle, d, *v, tile, v->cluster, v->option)) return algo;
  }
  if (v->cluster != CUBLASLT_CLUSTER_SHAPE_AUTO && v->cluster != CUBLASLT_CLUSTER_SHAPE_1x1x1)
    for (const TileSize& tile : largestFirst(better)) {
      const auto [tx, ty] = alongShorterSide(tile, 2);
      for (std::uint32_t option = 0; option <= v->options; ++option)
        if (auto algo = configured(lt, handle, d, *v, tile, clusterOf(tx, ty), option)) return algo;
    }
  if (!better.empty())
    WEFT_INFO(log::kTuning,
              "GEMM %zux%zux%zu (%d batches) untuned: none of %zu tiles that fit better than its "
              "heuristic's %ux%u runs with a cluster along its shorter side",
              s.m, s.n, s.k, s.batches, better.size(), v->own->rows, v->own->cols);
  return std::nullopt;
}

Result<std::shared_ptr<Gemms::Cached>> describe(const Lt& lt, cublasLtHandle_t handle,
                                                const GemmShape& s, const GemmScales& scales) {
  auto d = std::make_shared<Gemms::Cached>();
  d->lt = &lt;
  const cudaDataType_t t = cudaType(s.type), out = cudaType(s.out);
  // f32 accumulation and scalars whatever the values' type.
  cublasStatus_t e = lt.cublasLtMatmulDescCreate(&d->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (e != CUBLAS_STATUS_SUCCESS) return ltError(lt, "descriptor", e);
  if (s.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const auto biasType = static_cast<std::int32_t>(out);
    lt.cublasLtMatmulDescSetAttribute(d->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                      sizeof(epilogue));
    lt.cublasLtMatmulDescSetAttribute(d->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType,
                                      sizeof(biasType));
  }
  if (s.bTransposed) {
    const cublasOperation_t transposed = CUBLAS_OP_T;
    lt.cublasLtMatmulDescSetAttribute(d->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transposed,
                                      sizeof(transposed));
  }
  if (s.blockScales) {  // cuBLASLt's A is this Bᵀ (128 × 128 tiles), its B this A (1 × 128)
    const std::int32_t tiles = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const std::int32_t rows = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    lt.cublasLtMatmulDescSetAttribute(d->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &tiles,
                                      sizeof(tiles));
    lt.cublasLtMatmulDescSetAttribute(d->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &rows,
                                      sizeof(rows));
    // Its heuristic refuses block scales without their pointers (an "unsupported value"): the
    // first call's, set again by every call.
    lt.cublasLtMatmulDescSetAttribute(d->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scales.b,
                                      sizeof(scales.b));
    lt.cublasLtMatmulDescSetAttribute(d->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scales.a,
                                      sizeof(scales.a));
  }
  if (s.smCount > 0) {
    const std::int32_t sms = s.smCount;
    lt.cublasLtMatmulDescSetAttribute(d->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms,
                                      sizeof(sms));
  }
  auto layout = [&](cublasLtMatrixLayout_t& l, cudaDataType_t type, std::size_t rows,
                    std::size_t cols, std::size_t ld, std::size_t stride) -> cublasStatus_t {
    cublasStatus_t r =
        lt.cublasLtMatrixLayoutCreate(&l, type, rows, cols, static_cast<int64_t>(ld));
    if (r != CUBLAS_STATUS_SUCCESS || s.batches == 1) return r;
    const std::int32_t count = s.batches;
    const auto offset = static_cast<std::int64_t>(stride);
    r = lt.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                            sizeof(count));
    if (r != CUBLAS_STATUS_SUCCESS) return r;
    return lt.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                               &offset, sizeof(offset));
  };
  const std::size_t bRows = s.bTransposed ? s.k : s.n, bCols = s.bTransposed ? s.n : s.k;
  if ((e = layout(d->b, t, bRows, bCols, s.ldb, 0)) != CUBLAS_STATUS_SUCCESS ||
      (e = layout(d->a, t, s.k, s.m, s.lda, s.strideA)) != CUBLAS_STATUS_SUCCESS ||
      (e = layout(d->c, out, s.n, s.m, s.ldc, s.strideC)) != CUBLAS_STATUS_SUCCESS)
    return ltError(lt, "layout", e);
  cublasLtMatmulPreference_t pref = nullptr;
  if ((e = lt.cublasLtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS)
    return ltError(lt, "preference", e);
  const std::uint64_t ws = Gemms::kWorkspaceBytes;
  lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                          sizeof(ws));
  std::array<cublasLtMatmulHeuristicResult_t, kCandidates> results{};
  int found = 0;
  e = lt.cublasLtMatmulAlgoGetHeuristic(handle, d->desc, d->b, d->a, d->c, d->c, pref,
                                        static_cast<int>(results.size()), results.data(), &found);
  lt.cublasLtMatmulPreferenceDestroy(pref);
  if (e != CUBLAS_STATUS_SUCCESS) return ltError(lt, "heuristic", e);
  if (found == 0)
    return Status(Code::unsupported, "cuBLASLt has no algorithm for a " + std::to_string(s.m) +
                                         "x" + std::to_string(s.n) + "x" + std::to_string(s.k) +
                                         " " + std::string(name(s.type)) + " GEMM");
  d->algo = results[0].algo;
  auto splits = [&](const cublasLtMatmulAlgo_t& algo) {
    return configValue(lt, algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, std::int32_t{1});
  };
  if (splits(results[0].algo) == 1) {
    for (int i = 0; i < found; ++i)
      if (splits(results[static_cast<std::size_t>(i)].algo) == 1)
        d->candidates.push_back(results[static_cast<std::size_t>(i)].algo);
  }
  return d;
}

// An algorithm's configuration, for the tuning log: its id, tile (rows along n × along m),
// stages, cluster shape, kernel option and split-K.
std::string configOf(const Lt& lt, const cublasLtMatmulAlgo_t& algo) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attribute, auto fallback) {
    return configValue(lt, algo, attribute, fallback);
  };
  const auto tile = get(CUBLASLT_ALGO_CONFIG_TILE_ID, std::uint32_t{0});
  const TileSize* size = tileSize(tile);
  char text[160];
  std::snprintf(text, sizeof(text),
                "algo %d tile %u (%ux%u) stages %u cluster %u option %u split %d",
                get(CUBLASLT_ALGO_CONFIG_ID, std::int32_t{0}), tile, size ? size->rows : 0,
                size ? size->cols : 0, get(CUBLASLT_ALGO_CONFIG_STAGES_ID, std::uint32_t{0}),
                static_cast<unsigned>(get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, std::uint16_t{0})),
                get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, std::uint32_t{0}),
                get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, std::int32_t{1}));
  return text;
}

// Where ranks tune together, they first check that they tune the same shape (each value and its
// negation, so the largest of both is every rank's value only where all agree) and take the
// fewest candidates any rank has. Returns how many to time; 0 where they differ.
Result<std::size_t> agreedCount(const GemmShape& s, std::size_t count, const Gemms::Agree& agree) {
  if (!agree) return count;
  std::vector<float> v;
  for (std::size_t x : {s.m, s.n, s.k, static_cast<std::size_t>(s.batches)}) {
    v.push_back(static_cast<float>(x));
    v.push_back(-static_cast<float>(x));
  }
  v.push_back(-static_cast<float>(count));
  if (Status a = agree(v); !a) return a;
  for (std::size_t i = 0; i + 1 < v.size(); i += 2) {
    if (v[i] != -v[i + 1]) {
      WEFT_WARN(log::kTuning, "GEMM %zux%zux%zu: the ranks tune different shapes; untuned", s.m,
                s.n, s.k);
      return std::size_t{0};
    }
  }
  return static_cast<std::size_t>(-v.back());
}

// Times `which` of the candidates in kTuneRounds rounds, every other one in reverse order (so
// that the GPU's warming weighs on all alike), the GPU kept busy: each candidate `runs[i]` times
// in a row untimed (the clocks settle to what it draws), then as many between two events. With
// `agree`, the ranks meet before each candidate. Adds each one's mean to `us`.
template <typename Matmul>
Status timeRounds(const Gemms::Cached& d, const std::vector<std::size_t>& which,
                  const std::vector<int>& settle, const std::vector<int>& runs,
                  std::vector<bool>& ran, std::vector<float>& us, const Matmul& matmul,
                  cudaStream_t stream, const Gemms::Agree& agree) {
  constexpr int kTuneRounds = 2;
  std::vector<cudaEvent_t> events(2 * which.size(), nullptr);
  cudaError_t e = cudaSuccess;
  for (cudaEvent_t& x : events)
    if (e == cudaSuccess) e = cudaEventCreate(&x);
  Status met;
  for (int round = 0; round < kTuneRounds && e == cudaSuccess && met; ++round) {
    for (std::size_t j = 0; j < which.size() && e == cudaSuccess && met; ++j) {
      const std::size_t w = round % 2 == 0 ? j : which.size() - 1 - j, i = which[w];
      if (agree) {
        e = cudaStreamSynchronize(stream);
        std::vector<float> meet{0.0f};
        if (met = agree(meet); !met) break;
      }
      for (int r = 0; r < settle[w] && ran[i]; ++r)
        ran[i] = matmul(d.candidates[i]) == CUBLAS_STATUS_SUCCESS;
      if (e == cudaSuccess) e = cudaEventRecord(events[2 * w], stream);
      for (int r = 0; r < runs[w] && ran[i]; ++r)
        ran[i] = matmul(d.candidates[i]) == CUBLAS_STATUS_SUCCESS;
      if (e == cudaSuccess) e = cudaEventRecord(events[2 * w + 1], stream);
    }
    if (e == cudaSuccess && met) e = cudaStreamSynchronize(stream);
    for (std::size_t w = 0; w < which.size() && e == cudaSuccess && met; ++w) {
      float ms = 0;
      e = cudaEventElapsedTime(&ms, events[2 * w], events[2 * w + 1]);
      us[which[w]] += ms * 1000 / static_cast<float>(runs[w] * kTuneRounds);
    }
  }
  for (cudaEvent_t x : events)
    if (x != nullptr) (void)cudaEventDestroy(x);
  if (!met) return met;
  if (e != cudaSuccess)
    return Status(Code::systemError,
                  std::string("timing cuBLASLt's algorithms: ") + cudaGetErrorString(e));
  return {};
}

// Each candidate once (its first launch loads it, which idles the GPU); then every candidate a
// few runs at a time (a short look), and the heuristic's first with the kFinalists fastest of
// that look for kSustainUs each after as long untimed: a GEMM that draws more power runs slower
// sustained than in a short burst among others (docs/perf-tp-gemms.md, "Sustained tuning").
// The fastest sustained is kept where it beats the heuristic's first by 2 % (less is noise
// where ranks share the GPU). With `agree`, the ranks compare their slowest, and time alike.
// C is written again by the call's own GEMM after.
template <typename Matmul>
Status tune(Gemms::Cached& d, const GemmShape& s, const Matmul& matmul, cudaStream_t stream,
            const Gemms::Agree& agree) {
  constexpr int kLookRuns = 3, kMostRuns = 200;
  constexpr std::size_t kFinalists = 4;
  constexpr float kSustainUs = 15000;
  auto count = agreedCount(s, d.candidates.size(), agree);
  if (!count) return count.status();
  if (*count < 2) return {};
  constexpr float kFailed = std::numeric_limits<float>::infinity();
  std::vector<float> look(*count, 0.0f);
  std::vector<bool> ran(look.size());
  for (std::size_t i = 0; i < look.size(); ++i)  // not one that fails, where others run
    ran[i] = matmul(d.candidates[i]) == CUBLAS_STATUS_SUCCESS;
  std::vector<std::size_t> all(look.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  if (Status t =
          timeRounds(d, all, std::vector<int>(all.size(), 0),
                     std::vector<int>(all.size(), kLookRuns), ran, look, matmul, stream, agree);
      !t)
    return t;
  for (std::size_t i = 0; i < look.size(); ++i)
    if (!ran[i]) look[i] = kFailed;
  if (agree) {
    if (Status a = agree(look); !a) return a;
  }
  // The finalists, alike on every rank (from the agreed look), each as many runs as make
  // kSustainUs.
  const std::vector<std::size_t> finalists = tuningFinalists(look, kFinalists);
  std::vector<int> runs;
  for (std::size_t i : finalists) runs.push_back(sustainedRuns(look[i], kSustainUs, kMostRuns));
  std::vector<float> us(look.size(), kFailed);
  for (std::size_t i : finalists) us[i] = 0;
  if (Status t = timeRounds(d, finalists, runs, runs, ran, us, matmul, stream, agree); !t) return t;
  for (std::size_t i = 0; i < us.size(); ++i)
    if (!ran[i]) us[i] = kFailed;
  if (agree) {
    if (Status a = agree(us); !a) return a;
  }
  std::size_t best = 0;
  for (std::size_t i = 0; i < us.size(); ++i) {
    if (us[i] < us[best]) best = i;
    WEFT_TRACE(log::kTuning,
               "GEMM %zux%zux%zu (%d batches): candidate %zu, %s: %.1f us, %.1f us "
               "sustained",
               s.m, s.n, s.k, s.batches, i, configOf(*d.lt, d.candidates[i]).c_str(),
               static_cast<double>(look[i]), static_cast<double>(us[i]));
  }
  if (us[best] > 0.98f * us[0]) best = 0;  // us[0] failed (infinite): the best stands
  if (us[best] == kFailed) return {};      // none ran: the heuristic's first, as untuned
  d.algo = d.candidates[best];
  d.chosen = static_cast<int>(best);
  WEFT_INFO(log::kTuning,
            "GEMM %zux%zux%zu (%d batches) %s: cuBLASLt's candidate %zu of %zu, %.1f us sustained "
            "(its heuristic's first %.1f us)%s",
            s.m, s.n, s.k, s.batches, std::string(name(s.type)).c_str(), best + 1, us.size(),
            static_cast<double>(us[best]), static_cast<double>(us[0]),
            agree ? ", the slowest rank's" : "");
  return {};
}

}  // namespace

Result<std::unique_ptr<Gemms>> Gemms::create() {
  auto lt = loadLt();
  if (!lt) return lt.status();
  std::unique_ptr<Gemms> g(new Gemms());
  cublasLtHandle_t h = nullptr;
  if (cublasStatus_t e = (*lt)->cublasLtCreate(&h); e != CUBLAS_STATUS_SUCCESS)
    return ltError(**lt, "handle", e);
  g->handle_ = h;
  if (Status s = g->prime(); !s) return s;
  return g;
}

// cuBLASLt's first matmul in a process sets itself up with calls that wait for the whole device,
// where another rank's kernel may be waiting for this one's next (ranks as threads sharing a GPU):
// a small GEMM of each kind, run to completion while no such kernel can be running (a
// communicator's first tensor-parallel call, before its ranks meet to map their buffers).
Status Gemms::prime() {
  constexpr std::size_t kSide = 64;
  void* memory = nullptr;
  cudaStream_t stream = nullptr;
  const std::size_t matrix = kSide * kSide * sizeof(float);
  cudaError_t e = cudaMalloc(&memory, kWorkspaceBytes + 3 * matrix);
  if (e == cudaSuccess) e = cudaMemset(memory, 0, kWorkspaceBytes + 3 * matrix);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  Status s;
  if (e == cudaSuccess) {
    auto* m = static_cast<std::byte*>(memory);
    for (DataType type : {DataType::bf16, DataType::f8e4m3}) {
      GemmShape g;
      g.m = g.n = g.k = g.lda = g.ldb = g.ldc = kSide;
      g.type = type;
      g.out = DataType::bf16;
      g.bTransposed = type == DataType::f8e4m3;
      // fp8 is Hopper's and later: where it has no algorithm, there is nothing to set up.
      Status r = run(g, m + kWorkspaceBytes, m + kWorkspaceBytes + matrix,
                     m + kWorkspaceBytes + 2 * matrix, nullptr, m, stream);
      if (!r && type == DataType::bf16) s = r;
    }
    e = cudaStreamSynchronize(stream);
  }
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  if (memory != nullptr) (void)cudaFree(memory);
  if (e != cudaSuccess)
    return Status(Code::systemError, std::string("priming cuBLASLt: ") + cudaGetErrorString(e));
  return s;
}

int Gemms::chosen(const GemmShape& s) const {
  auto it = cache_.find(s.key());
  return it == cache_.end() ? -1 : it->second->chosen;
}

int Gemms::tile(const GemmShape& s) const {
  auto it = cache_.find(s.key());
  return it == cache_.end() ? -1 : it->second->tile;
}

int Gemms::offered(const GemmShape& s) const {
  auto it = cache_.find(s.key());
  return it == cache_.end() ? -1 : it->second->offered;
}

Gemms::~Gemms() {
  cache_.clear();
  if (handle_ != nullptr) (*loadLt())->cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

Status Gemms::run(const GemmShape& s, const void* a, const void* b, void* c, const void* bias,
                  void* workspace, void* stream, GemmScales scales) {
  if (s.m == 0 || s.n == 0) return {};
  if (s.blockScales && s.batches > 1) {  // block scales have no batch stride: one GEMM each
    GemmShape one = s;
    one.batches = 1;
    one.strideA = one.strideC = 0;
    for (int i = 0; i < s.batches; ++i) {
      const auto I = static_cast<std::size_t>(i);
      GemmScales at = scales;
      at.a = scales.a + I * scales.aBatchFloats;
      if (Status r = run(one, static_cast<const std::byte*>(a) + I * s.strideA * sizeOf(s.type), b,
                         static_cast<std::byte*>(c) + I * s.strideC * sizeOf(s.out), bias,
                         workspace, stream, at);
          !r)
        return r;
    }
    return {};
  }
  auto lt = loadLt();
  if (!lt) return lt.status();
  const auto handle = static_cast<cublasLtHandle_t>(handle_);
  auto it = cache_.find(s.key());
  const bool first = it == cache_.end();
  if (first) {
    auto d = describe(**lt, handle, s, scales);
    if (!d) return d.status();
    it = cache_.emplace(s.key(), *d).first;
  }
  Cached& d = *it->second;
  if (s.bias) {
    (*lt)->cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                          sizeof(bias));
  }
  if (s.type == DataType::f8e4m3) {  // cuBLASLt's A is this B
    (*lt)->cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scales.b,
                                          sizeof(scales.b));
    (*lt)->cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scales.a,
                                          sizeof(scales.a));
  }
  const auto on = static_cast<cudaStream_t>(stream);
  auto matmul = [&](const cublasLtMatmulAlgo_t& algo) {
    const float one = 1.0f, zero = 0.0f;
    return (*lt)->cublasLtMatmul(handle, d.desc, &one, b, d.b, a, d.a, &zero, c, d.c, c, d.c, &algo,
                                 workspace, kWorkspaceBytes, on);
  };
  if (first) {
    // Ranks tuning together all take part, those whose heuristic gave them no candidate too.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if ((kept_ >= 0 || tuning_) && !d.candidates.empty())
      fitted(**lt, handle, d, s, d.candidates.front());
    d.offered = static_cast<int>(d.candidates.size());
    if (kept_ >= 0 && !d.candidates.empty()) {
      d.chosen = std::min(kept_, static_cast<int>(d.candidates.size()) - 1);
      d.algo = d.candidates[static_cast<std::size_t>(d.chosen)];
      WEFT_INFO(log::kTuning, "GEMM %zux%zux%zu (%d batches) kept candidate %d of %d: %s", s.m, s.n,
                s.k, s.batches, d.chosen, d.offered, configOf(**lt, d.algo).c_str());
    } else if (kept_ < 0 && tuning_ && (agree_ || d.candidates.size() > 1) &&
               cudaStreamIsCapturing(on, &capture) == cudaSuccess &&
               capture == cudaStreamCaptureStatusNone) {
      if (Status t = tune(d, s, matmul, on, agree_); !t) return t;
    } else if (kept_ < 0 && fitting_ && !d.candidates.empty()) {
      if (auto fit = fittedUntuned(**lt, handle, d, s, d.candidates.front())) {
        d.algo = *fit;
        d.chosen = kFitted;
        WEFT_INFO(log::kTuning, "GEMM %zux%zux%zu (%d batches) untuned: a wave-fitted tile, %s",
                  s.m, s.n, s.k, s.batches, configOf(**lt, d.algo).c_str());
      }
    }
    d.candidates.clear();  // chosen for good: a shape's GEMMs sum alike from then on
    d.tile = static_cast<int>(configValue(**lt, d.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, 0u));
  }
  const cublasStatus_t e = matmul(d.algo);
  if (e != CUBLAS_STATUS_SUCCESS) return ltError(**lt, "matmul", e);
  return {};
}

}  // namespace weft::fused::tp
