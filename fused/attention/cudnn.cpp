#include "fused/attention/cudnn.hpp"

#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "fused/attention/merge.hpp"

#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>

#include "topology/shared_library.hpp"

namespace weft::fused::attention {
namespace {

// cuDNN's entry points, bound once for the process.
struct Dnn {
  topo::SharedLibrary library;
  // clang-format off
#define WEFT_DNN_FUNCTIONS(X)                                                             \
  X(cudnnGetVersion) X(cudnnCreate) X(cudnnDestroy) X(cudnnSetStream)                     \
  X(cudnnGetErrorString) X(cudnnGetLastErrorString)                                       \
  X(cudnnBackendCreateDescriptor) X(cudnnBackendDestroyDescriptor)                        \
  X(cudnnBackendSetAttribute) X(cudnnBackendGetAttribute) X(cudnnBackendFinalize)         \
  X(cudnnBackendExecute)
  // clang-format on
#define WEFT_DNN_POINTER(f) decltype(&::f) f = nullptr;
  WEFT_DNN_FUNCTIONS(WEFT_DNN_POINTER)
#undef WEFT_DNN_POINTER
  std::size_t version = 0;
};

Result<const Dnn*> loadDnn() {
  static std::once_flag once;
  static Dnn dnn;
  static Status loaded;
  std::call_once(once, [] {
    const std::string major = std::to_string(CUDNN_MAJOR);
    auto lib = topo::SharedLibrary::open("libcudnn.so." + major, "cuDNN");
    if (!lib) {
      loaded = lib.status();
      return;
    }
    dnn.library = std::move(*lib);
#define WEFT_DNN_BIND(f)                                                                        \
  if (!dnn.library.bind(#f, dnn.f)) {                                                           \
    loaded = Status(Code::unsupported, "cuDNN lacks " #f " (cuDNN " + major + "'s is needed)"); \
    return;                                                                                     \
  }
    WEFT_DNN_FUNCTIONS(WEFT_DNN_BIND)
#undef WEFT_DNN_BIND
    dnn.version = dnn.cudnnGetVersion();
  });
  if (!loaded) return loaded;
  return &dnn;
}

Status dnnError(const Dnn& d, const std::string& what, cudnnStatus_t s) {
  char detail[512] = "";
  d.cudnnGetLastErrorString(detail, sizeof detail);
  return Status(Code::systemError, "cuDNN " + what + ": " + d.cudnnGetErrorString(s) +
                                       (detail[0] != 0 ? std::string(" (") + detail + ")" : ""));
}

using Dims = std::array<std::int64_t, 4>;

// A shape's graph: its descriptors (kept while the plan lives) and the finalized plan.
struct Plan {
  const Dnn* dnn = nullptr;
  std::deque<cudnnBackendDescriptor_t> owned;
  cudnnBackendDescriptor_t plan = nullptr;
  std::int64_t workspace = 0;
  ~Plan() {
    for (auto d : owned) dnn->cudnnBackendDestroyDescriptor(d);
  }
};

// Builds one graph's descriptors, remembering the first failure.
class Builder {
 public:
  Builder(const Dnn& dnn, Plan& plan) : dnn_(dnn), plan_(plan) {}
  Status status() const { return status_; }

  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    if (status_) check("a descriptor", dnn_.cudnnBackendCreateDescriptor(type, &d));
    if (d != nullptr) plan_.owned.push_back(d);
    return d;
  }
  template <typename T>
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, const T* values, std::int64_t count = 1) {
    if (status_)
      check("attribute " + std::to_string(name),
            dnn_.cudnnBackendSetAttribute(d, name, type, count, values));
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendDescriptor_t value) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &value);
  }
  cudnnBackendDescriptor_t finalize(cudnnBackendDescriptor_t d, const char* what) {
    if (status_) check(what, dnn_.cudnnBackendFinalize(d));
    return d;
  }

  // A tensor [1, heads, rows, cols] (strides given); virtual ones live only inside the graph.
  cudnnBackendDescriptor_t tensor(std::int64_t uid, cudnnDataType_t type, Dims dims, Dims strides,
                                  bool isVirtual = false, bool byValue = false) {
    auto d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const std::int64_t alignment = 16;
    set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type);
    set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4);
    set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4);
    set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid);
    set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment);
    const bool yes = true;
    if (isVirtual) set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &yes);
    if (byValue) set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &yes);
    return finalize(d, "a tensor");
  }
  // A graph-internal tensor like `like`'s shape: [1, h, sq, cols], packed.
  cudnnBackendDescriptor_t scratch(cudnnDataType_t type, std::int64_t h, std::int64_t sq,
                                   std::int64_t cols) {
    return tensor(nextUid_++, type, {1, h, sq, cols}, {h * sq * cols, sq * cols, cols, 1}, true);
  }

  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT, std::int64_t axis = -1) {
    auto pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &precision);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    finalize(pw, "a pointwise descriptor");
    auto op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    if (t != nullptr) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    const float one = 1;
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, &one);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, &one);
    ops_.push_back(finalize(op, "a pointwise operation"));
  }
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    auto mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32);
    finalize(mm, "a matmul descriptor");
    auto op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    ops_.push_back(finalize(op, "a matmul"));
  }
  void reduce(cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    auto r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32);
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &how);
    if (dnn_.version >= 91100) {
      const bool no = false;
      set(r, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, &no);
    }
    finalize(r, "a reduction descriptor");
    auto op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    ops_.push_back(finalize(op, "a reduction"));
  }
  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }

 private:
  void check(const std::string& what, cudnnStatus_t s) {
    if (s != CUDNN_STATUS_SUCCESS) status_ = dnnError(dnn_, what, s);
  }
  const Dnn& dnn_;
  Plan& plan_;
  Status status_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::int64_t nextUid_ = 100;
};

// The real tensors' ids in a variant pack.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kNegInf };

// One piece's shape: queries sq of hq heads, keys skv of hkv heads; rows of q, o hold hq · dim
// values, of k, v hkv · dim (the tokens' packed layout).
struct Key {
  std::int64_t sq, skv, hq, hkv, dim;
  int type;
  bool causal;
  auto tuple() const { return std::make_tuple(sq, skv, hq, hkv, dim, type, causal); }
};

// Q·Kᵀ · scale (masked: −inf above the diagonal), softmax with its log-sum-exp as Stats, then
// P·V: cuDNN's fused flash attention matches this graph.
Result<std::unique_ptr<Plan>> build(const Dnn& dnn, cudnnHandle_t handle, const Key& k) {
  auto plan = std::make_unique<Plan>();
  plan->dnn = &dnn;
  Builder b(dnn, *plan);
  const cudnnDataType_t io =
      k.type == static_cast<int>(DataType::f16) ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  const std::int64_t hq = k.hq, hkv = k.hkv, d = k.dim, sq = k.sq, skv = k.skv;
  auto q = b.tensor(kQ, io, {1, hq, sq, d}, {sq * hq * d, d, hq * d, 1});
  auto kt = b.tensor(kK, io, {1, hkv, d, skv}, {skv * hkv * d, d, 1, hkv * d});
  auto v = b.tensor(kV, io, {1, hkv, skv, d}, {skv * hkv * d, d, hkv * d, 1});
  auto o = b.tensor(kO, io, {1, hq, sq, d}, {sq * hq * d, d, hq * d, 1});
  auto stats = b.tensor(kStats, CUDNN_DATA_FLOAT, {1, hq, sq, 1}, {hq * sq, sq, 1, 1});
  auto scale = b.tensor(kScale, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  auto s0 = b.scratch(CUDNN_DATA_FLOAT, hq, sq, skv);
  b.matmul(q, kt, s0);
  auto s1 = b.scratch(CUDNN_DATA_FLOAT, hq, sq, skv);
  b.pointwise(CUDNN_POINTWISE_MUL, s0, scale, s1);
  auto masked = s1;
  if (k.causal) {
    auto negInf = b.tensor(kNegInf, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
    auto row = b.scratch(CUDNN_DATA_INT32, hq, sq, skv);
    auto col = b.scratch(CUDNN_DATA_INT32, hq, sq, skv);
    auto keep = b.scratch(CUDNN_DATA_BOOLEAN, hq, sq, skv);
    b.pointwise(CUDNN_POINTWISE_GEN_INDEX, s1, nullptr, row, nullptr, CUDNN_DATA_INT32, 2);
    b.pointwise(CUDNN_POINTWISE_GEN_INDEX, s1, nullptr, col, nullptr, CUDNN_DATA_INT32, 3);
    b.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, nullptr, CUDNN_DATA_BOOLEAN);
    masked = b.scratch(CUDNN_DATA_FLOAT, hq, sq, skv);
    b.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s1, negInf, masked, keep);
  }
  auto most = b.scratch(CUDNN_DATA_FLOAT, hq, sq, 1);
  b.reduce(CUDNN_REDUCE_TENSOR_MAX, masked, most);
  auto shifted = b.scratch(CUDNN_DATA_FLOAT, hq, sq, skv);
  b.pointwise(CUDNN_POINTWISE_SUB, masked, most, shifted);
  auto exps = b.scratch(CUDNN_DATA_FLOAT, hq, sq, skv);
  b.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, exps);
  auto sum = b.scratch(CUDNN_DATA_FLOAT, hq, sq, 1);
  b.reduce(CUDNN_REDUCE_TENSOR_ADD, exps, sum);
  auto logSum = b.scratch(CUDNN_DATA_FLOAT, hq, sq, 1);
  b.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, logSum);
  b.pointwise(CUDNN_POINTWISE_ADD, most, logSum, stats);
  auto p = b.scratch(io, hq, sq, skv);
  b.pointwise(CUDNN_POINTWISE_DIV, exps, sum, p);
  b.matmul(p, v, o);
  if (Status s = b.status(); !s) return s;

  auto graph = b.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  b.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, b.ops().data(),
        static_cast<std::int64_t>(b.ops().size()));
  b.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle);
  b.finalize(graph, "the attention graph");
  auto heuristics = b.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  b.set(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  b.set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
  b.finalize(heuristics, "the engine heuristics");
  if (Status s = b.status(); !s) return s;
  std::int64_t count = 0;
  if (auto e = dnn.cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
      e != CUDNN_STATUS_SUCCESS)
    return dnnError(dnn, "the engine heuristics' results", e);
  std::vector<cudnnBackendDescriptor_t> configs;
  for (std::int64_t i = 0; i < count; ++i)
    configs.push_back(b.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
  if (Status s = b.status(); !s) return s;
  if (auto e = dnn.cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count,
                                            configs.data());
      e != CUDNN_STATUS_SUCCESS)
    return dnnError(dnn, "the engine heuristics' results", e);
  // The first configuration that finalizes, in the heuristics' order.
  Status last = Status(Code::unsupported, "cuDNN has no engine for this attention");
  for (std::int64_t i = 0; i < count; ++i) {
    cudnnBackendDescriptor_t candidate = nullptr;
    if (dnn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &candidate) !=
        CUDNN_STATUS_SUCCESS)
      continue;
    plan->owned.push_back(candidate);
    auto e = dnn.cudnnBackendSetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &configs[i]);
    if (e == CUDNN_STATUS_SUCCESS)
      e = dnn.cudnnBackendSetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                       CUDNN_TYPE_HANDLE, 1, &handle);
    if (e == CUDNN_STATUS_SUCCESS) e = dnn.cudnnBackendFinalize(candidate);
    if (e != CUDNN_STATUS_SUCCESS) {
      last = dnnError(dnn, "an attention plan", e);
      continue;
    }
    std::int64_t got = 0;
    if (auto w = dnn.cudnnBackendGetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                              CUDNN_TYPE_INT64, 1, &got, &plan->workspace);
        w != CUDNN_STATUS_SUCCESS)
      return dnnError(dnn, "an attention plan's workspace", w);
    if (static_cast<std::size_t>(plan->workspace) > kCudnnWorkspaceBytes) {
      last =
          Status(Code::unsupported,
                 "cuDNN's attention plans need more than " + std::to_string(kCudnnWorkspaceBytes) +
                     " bytes of workspace (" + std::to_string(plan->workspace) + ")");
      continue;
    }
    plan->plan = candidate;
    return plan;
  }
  return last;
}

// One thread's handle on one device, with its plans.
struct Runner {
  const Dnn* dnn = nullptr;
  cudnnHandle_t handle = nullptr;
  std::map<decltype(Key{}.tuple()), std::unique_ptr<Plan>> plans;
  ~Runner() {
    plans.clear();
    if (handle != nullptr) dnn->cudnnDestroy(handle);
  }
  Result<const Plan*> planFor(const Key& k) {
    if (auto it = plans.find(k.tuple()); it != plans.end()) return it->second.get();
    auto p = build(*dnn, handle, k);
    if (!p) return p.status();
    return plans.emplace(k.tuple(), std::move(*p)).first->second.get();
  }
};

Result<Runner*> runnerHere() {
  auto dnn = loadDnn();
  if (!dnn) return dnn.status();
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return Status(Code::systemError, std::string("cuDNN attention: ") + cudaGetErrorString(e));
  thread_local std::map<int, std::unique_ptr<Runner>> runners;
  auto& r = runners[device];
  if (!r) {
    auto fresh = std::make_unique<Runner>();
    fresh->dnn = *dnn;
    if (auto e = (*dnn)->cudnnCreate(&fresh->handle); e != CUDNN_STATUS_SUCCESS) {
      fresh->handle = nullptr;
      return dnnError(**dnn, "a handle", e);
    }
    r = std::move(fresh);
  }
  return r.get();
}

struct Range {
  std::size_t begin, length;
};
Range rangeOf(Part p, std::size_t tokens) {
  if (p == Part::first) return {0, tokens / 2};
  if (p == Part::second) return {tokens / 2, tokens - tokens / 2};
  return {0, tokens};
}

std::size_t outBytes(const LocalAttention& a) {
  return cudnnAligned(a.tokensQ * static_cast<std::size_t>(a.heads * a.dim) * 2);
}

}  // namespace

Status cudnnAvailable() {
  auto dnn = loadDnn();
  return dnn ? Status{} : dnn.status();
}

bool cudnnCovers(const LocalAttention& a) {
  return a.sequences == 1 && (a.dim == 64 || a.dim == 128) &&
         (a.type == DataType::bf16 || a.type == DataType::f16) &&
         (!a.piece.causal || a.piece.q == a.piece.kv) && (a.merge || a.piece.q == Part::all);
}

Status attendWithCudnn(const LocalAttention& a, void* stream, bool mergeToo) {
  if (!cudnnCovers(a)) return unsupported("cuDNN's attention does not cover this shape");
  if (a.fresh && a.piece.q != Part::all)
    return Status(Code::internalError, "cuDNN's attention: fresh partials need every query");
  auto runner = runnerHere();
  if (!runner) return runner.status();
  Runner& r = **runner;
  const Range q = rangeOf(a.piece.q, a.tokensQ), kv = rangeOf(a.piece.kv, a.tokensQ);
  if (q.length == 0 || kv.length == 0) return {};
  const auto hq = static_cast<std::size_t>(a.heads), hkv = static_cast<std::size_t>(a.kvHeads);
  const auto d = static_cast<std::size_t>(a.dim);
  auto plan = r.planFor({static_cast<std::int64_t>(q.length), static_cast<std::int64_t>(kv.length),
                         a.heads, a.kvHeads, a.dim, static_cast<int>(a.type), a.piece.causal});
  if (!plan) return plan.status();
  const std::size_t es = 2;
  auto* scratch = static_cast<std::byte*>(a.scratch);
  if (a.scratchBytes < cudnnScratchBytes(a))
    return Status(Code::internalError,
                  "cuDNN's attention needs " + std::to_string(cudnnScratchBytes(a)) +
                      " bytes of scratch, " + std::to_string(a.scratchBytes) + " given");
  const std::size_t own = cudnnScratchBytes(a) - kCudnnWorkspaceBytes;
  void* out = a.merge ? scratch : a.out;
  float* lse = a.merge ? reinterpret_cast<float*>(scratch + outBytes(a)) : a.lse;
  float scale = a.scale, negInf = -INFINITY;
  std::array<void*, 7> data{
      const_cast<std::byte*>(static_cast<const std::byte*>(a.q) + q.begin * hq * d * es),
      const_cast<std::byte*>(static_cast<const std::byte*>(a.k) + kv.begin * hkv * d * es),
      const_cast<std::byte*>(static_cast<const std::byte*>(a.v) + kv.begin * hkv * d * es),
      out,
      lse,
      &scale,
      &negInf};
  std::array<std::int64_t, 7> uids{kQ, kK, kV, kO, kStats, kScale, kNegInf};
  const std::int64_t used = a.piece.causal ? 7 : 6;
  const Dnn& dnn = *r.dnn;
  cudnnBackendDescriptor_t pack = nullptr;
  if (auto e = dnn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
      e != CUDNN_STATUS_SUCCESS)
    return dnnError(dnn, "a variant pack", e);
  void* workspace = scratch == nullptr ? nullptr : scratch + own;
  auto e = dnn.cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                        CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (e == CUDNN_STATUS_SUCCESS)
    e = dnn.cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                     CUDNN_TYPE_VOID_PTR, used, data.data());
  if (e == CUDNN_STATUS_SUCCESS)
    e = dnn.cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                     used, uids.data());
  if (e == CUDNN_STATUS_SUCCESS) e = dnn.cudnnBackendFinalize(pack);
  if (e == CUDNN_STATUS_SUCCESS)
    e = dnn.cudnnSetStream(r.handle, static_cast<cudaStream_t>(stream));
  if (e == CUDNN_STATUS_SUCCESS) e = dnn.cudnnBackendExecute(r.handle, (*plan)->plan, pack);
  dnn.cudnnBackendDestroyDescriptor(pack);
  if (e != CUDNN_STATUS_SUCCESS) return dnnError(dnn, "attention", e);
  if (!a.merge || !mergeToo) return {};
  MergeShape shape{q.length, hq, d};
  shape.lseStride = a.tokensQ;
  shape.fresh = a.fresh;
  return mergeOnDevice(static_cast<float*>(a.out) + q.begin * hq * d, a.lse + q.begin, out, lse,
                       a.type, shape, stream);
}

}  // namespace weft::fused::attention

#else  // no cuDNN headers: weft's own kernel everywhere

namespace weft::fused::attention {

Status cudnnAvailable() {
  return unsupported("weft was built without cuDNN's headers");
}
bool cudnnCovers(const LocalAttention&) {
  return false;
}
Status attendWithCudnn(const LocalAttention&, void*) {
  return cudnnAvailable();
}

}  // namespace weft::fused::attention

#endif
