// --compare nccl: each collective through NCCL on the same device buffers and the same stream, in
// the same process, one NCCL rank per weft rank:
//   allreduce ncclAllReduce, allgather ncclAllGather, reducescatter ncclReduceScatter, broadcast
//   ncclBroadcast, reduce ncclReduce, alltoall ncclSend/ncclRecv to every peer in one group (as
//   nccl-tests does). Timed as weft's calls are: CUDA events around the calls on the stream.
// NCCL refuses two ranks on one GPU, so when ranks share one no NCCL communicator is made and
// every row's peer columns read N/A (the preamble says why).
#include "perf/peer.hpp"

#ifdef WEFT_PERF_HAVE_NCCL
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <set>

#include "perf/control.hpp"

namespace weft::perf {
namespace {

std::optional<ncclDataType_t> ncclType(DataType t) {
  switch (t) {
    case DataType::f64:
      return ncclFloat64;
    case DataType::f32:
      return ncclFloat32;
    case DataType::f16:
      return ncclFloat16;
    case DataType::bf16:
      return ncclBfloat16;
    case DataType::i8:
      return ncclInt8;
    case DataType::u8:
      return ncclUint8;
    case DataType::i32:
      return ncclInt32;
    case DataType::u32:
      return ncclUint32;
    case DataType::i64:
      return ncclInt64;
    case DataType::u64:
      return ncclUint64;
    case DataType::f8e4m3:
    case DataType::f8e5m2:
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
      return t == DataType::f8e4m3 ? ncclFloat8e4m3 : ncclFloat8e5m2;
#else
      return std::nullopt;
#endif
  }
  return std::nullopt;
}

ncclRedOp_t ncclOp(RedOp op) {
  switch (op) {
    case RedOp::prod:
      return ncclProd;
    case RedOp::min:
      return ncclMin;
    case RedOp::max:
      return ncclMax;
    case RedOp::avg:
      return ncclAvg;
    case RedOp::sum:
      break;
  }
  return ncclSum;
}

// "NCCL 2.28.3 (/usr/lib/x86_64-linux-gnu/libnccl.so.2)": which library answers, so that a run
// with weft's own NCCL shim on the library path cannot pass for NCCL unnoticed.
std::string describeNccl() {
  int version = 0;
  (void)ncclGetVersion(&version);
  const int major = version >= 10000 ? version / 10000 : version / 1000;
  const int minor = version >= 10000 ? version / 100 % 100 : version / 100 % 10;
  std::string out = "NCCL " + std::to_string(major) + "." + std::to_string(minor) + "." +
                    std::to_string(version % 100);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) != 0 && info.dli_fname != nullptr)
    out += std::string(" (") + info.dli_fname + ")";
  return out;
}

class NcclPeer final : public Peer {
 public:
  NcclPeer(ncclComm_t comm, Control& control, void* stream, int rank, int nranks)
      : comm_(comm),
        control_(control),
        stream_(static_cast<cudaStream_t>(stream)),
        rank_(rank),
        nranks_(nranks) {
    (void)cudaEventCreate(&start_);
    (void)cudaEventCreate(&stop_);
  }
  ~NcclPeer() override {
    (void)cudaStreamSynchronize(stream_);
    (void)ncclCommDestroy(comm_);
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }

  std::string name() const override { return "nccl"; }

  std::optional<double> secondsPerCall(Collective c, const Layout& l, DataType type, RedOp op,
                                       int root, const void* sendBase, void* recvBase,
                                       const Rotation& rotation, int warmup, int iters,
                                       int graphLaunches) override {
    const auto t = ncclType(type);
    if (!t || c == Collective::sendRecv || c == Collective::allToAllv) return std::nullopt;
    const std::size_t e = sizeOf(type);
    auto call = [&](std::size_t shift) -> ncclResult_t {
      const std::byte* send = static_cast<const std::byte*>(sendBase) + shift;
      std::byte* recv = static_cast<std::byte*>(recvBase) + shift;
      switch (c) {
        case Collective::allReduce:
          return ncclAllReduce(send, recv, l.count, *t, ncclOp(op), comm_, stream_);
        case Collective::allGather:
          return ncclAllGather(send, recv, l.count, *t, comm_, stream_);
        case Collective::reduceScatter:
          return ncclReduceScatter(send, recv, l.count, *t, ncclOp(op), comm_, stream_);
        case Collective::broadcast:
          return ncclBroadcast(send, recv, l.count, *t, root, comm_, stream_);
        case Collective::reduce:
          return ncclReduce(send, recv, l.count, *t, ncclOp(op), root, comm_, stream_);
        case Collective::allToAll:
        case Collective::allToAllv:
        case Collective::sendRecv:
          break;
      }
      ncclResult_t r = ncclGroupStart();
      for (int q = 0; q < nranks_ && r == ncclSuccess; ++q) {
        const std::size_t at = static_cast<std::size_t>(q) * l.count * e;
        r = ncclSend(send + at, l.count, *t, q, comm_, stream_);
        if (r == ncclSuccess) r = ncclRecv(recv + at, l.count, *t, q, comm_, stream_);
      }
      const ncclResult_t ended = ncclGroupEnd();
      return r != ncclSuccess ? r : ended;
    };
    for (int i = 0; i < warmup; ++i) {
      if (!ok(call(0), "warm-up")) return std::nullopt;
    }
    if (cudaStreamSynchronize(stream_) != cudaSuccess) return std::nullopt;
    if (graphLaunches > 0) return graphSecondsPerCall(call, rotation, iters, graphLaunches);
    if (!control_.barrier().isOk()) return std::nullopt;
    (void)cudaEventRecord(start_, stream_);
    for (int i = 0; i < iters; ++i) {
      if (!ok(call(rotation.at(static_cast<std::size_t>(i))), "timed call")) return std::nullopt;
    }
    (void)cudaEventRecord(stop_, stream_);
    float ms = 0;
    if (cudaStreamSynchronize(stream_) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start_, stop_) != cudaSuccess)
      return std::nullopt;
    return static_cast<double>(ms) * 1e-3 / iters;
  }

 private:
  // -G: the `iters` calls captured into one graph (this thread's capture only, as weft-perf
  // captures weft's), launched once untimed, then `launches` times between the events.
  template <typename Call>
  std::optional<double> graphSecondsPerCall(const Call& call, const Rotation& rotation, int iters,
                                            int launches) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    auto fail = [&](const char* what, cudaError_t e) -> std::optional<double> {
      std::fprintf(stderr, "weft-perf: rank %d: NCCL in a CUDA graph: %s: %s\n", rank_, what,
                   cudaGetErrorString(e));
      if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      return std::nullopt;
    };
    if (cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
        e != cudaSuccess)
      return fail("cudaStreamBeginCapture", e);
    bool captured = true;
    for (int i = 0; i < iters && captured; ++i)
      captured = ok(call(rotation.at(static_cast<std::size_t>(i))), "captured call");
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (!captured) return fail("capture", ended != cudaSuccess ? ended : cudaErrorUnknown);
    if (ended != cudaSuccess) return fail("cudaStreamEndCapture", ended);
    if (cudaError_t e = cudaGraphInstantiate(&exec, graph, 0); e != cudaSuccess)
      return fail("cudaGraphInstantiate", e);
    if (cudaError_t e = cudaGraphLaunch(exec, stream_); e != cudaSuccess)
      return fail("cudaGraphLaunch", e);
    if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess)
      return fail("warm-up launch", e);
    if (!control_.barrier().isOk()) return fail("barrier", cudaSuccess);
    (void)cudaEventRecord(start_, stream_);
    for (int k = 0; k < launches; ++k) {
      if (cudaError_t e = cudaGraphLaunch(exec, stream_); e != cudaSuccess)
        return fail("cudaGraphLaunch", e);
    }
    (void)cudaEventRecord(stop_, stream_);
    float ms = 0;
    cudaError_t e = cudaStreamSynchronize(stream_);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, start_, stop_);
    if (e != cudaSuccess) return fail("timed launches", e);
    (void)cudaGraphExecDestroy(exec);
    (void)cudaGraphDestroy(graph);
    return static_cast<double>(ms) * 1e-3 / (static_cast<double>(iters) * launches);
  }

  bool ok(ncclResult_t r, const char* what) const {
    if (r == ncclSuccess) return true;
    std::fprintf(stderr, "weft-perf: rank %d: NCCL %s: %s (%s)\n", rank_, what,
                 ncclGetErrorString(r), ncclGetLastError(comm_));
    return false;
  }

  ncclComm_t comm_;
  Control& control_;
  cudaStream_t stream_;
  int rank_, nranks_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

bool ncclBuilt() {
  return true;
}

Result<NcclJoin> joinNccl(Control& control, void* stream, int rank, int nranks,
                          const std::string& host, const std::string& busId) {
  NcclJoin out;
  out.description = describeNccl();
  // Every rank sees every rank's GPU, so all take the same branch.
  auto gpus = control.gather(host + " " + busId);
  if (!gpus) return gpus.status();
  std::set<std::string> seen;
  for (std::size_t r = 0; r < gpus->size(); ++r) {
    if (!seen.insert((*gpus)[r]).second) {
      out.why = "ranks share a GPU (" + (*gpus)[r] + "), which NCCL refuses: run one rank per GPU";
      return out;
    }
  }
  // Rank 0's id, and whether it could make one, to every rank.
  struct {
    int ok;
    ncclUniqueId id;
  } shared{};
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&shared.id);
    shared.ok = r == ncclSuccess;
    if (!shared.ok) out.why = std::string("ncclGetUniqueId: ") + ncclGetErrorString(r);
  }
  if (Status s = control.broadcast(&shared, sizeof shared); !s) return s;
  if (!shared.ok) {
    if (out.why.empty()) out.why = "rank 0 could not make an NCCL id";
    return out;
  }
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, nranks, shared.id, rank); r != ncclSuccess)
    return Status(Code::systemError,
                  "rank " + std::to_string(rank) + ": --compare nccl: ncclCommInitRank: " +
                      ncclGetErrorString(r) + " (" + ncclGetLastError(nullptr) + ")");
  out.peer = std::make_unique<NcclPeer>(comm, control, stream, rank, nranks);
  return out;
}

}  // namespace weft::perf

#else

namespace weft::perf {

bool ncclBuilt() {
  return false;
}

Result<NcclJoin> joinNccl(Control&, void*, int, int, const std::string&, const std::string&) {
  return Status(Code::unsupported,
                "--compare nccl: this weft-perf was built without NCCL (it needs nccl.h and "
                "libnccl.so where CMake looks, and CUDA)");
}

}  // namespace weft::perf

#endif
