// runTp on the GPU: the chunks' collectives on a side stream of the communicator's, its GEMMs on
// the caller's stream, each waiting for the other's through events (capturable: the side stream
// forks from the caller's and joins it again).
#include <cuda_runtime.h>

#include <string>

#include "fused/tp/gemm.hpp"
#include "fused/tp/overlap.hpp"

namespace weft::fused::tp {
namespace {

Status cudaFailed(const char* what, cudaError_t e) {
  return Status(Code::systemError,
                std::string("tensor-parallel ") + what + ": " + cudaGetErrorString(e));
}

// What a communicator keeps for its tensor-parallel calls.
struct State {
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, chunk = nullptr, join = nullptr;
  std::unique_ptr<Gemms> gemms;
  ~State() {
    if (side != nullptr) cudaStreamSynchronize(side);
    for (cudaEvent_t e : {fork, chunk, join})
      if (e != nullptr) cudaEventDestroy(e);
    if (side != nullptr) cudaStreamDestroy(side);
  }
};

Result<State*> stateOf(Communicator& comm) {
  std::shared_ptr<void>& slot = comm.fusedState("tp");
  if (slot) return static_cast<State*>(slot.get());
  auto s = std::make_shared<State>();
  if (cudaError_t e = cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking); e != cudaSuccess)
    return cudaFailed("side stream", e);
  for (cudaEvent_t* e : {&s->fork, &s->chunk, &s->join}) {
    if (cudaError_t r = cudaEventCreateWithFlags(e, cudaEventDisableTiming); r != cudaSuccess)
      return cudaFailed("event", r);
  }
  auto gemms = Gemms::create();
  if (!gemms) return gemms.status();
  s->gemms = std::move(*gemms);
  slot = s;
  return s.get();
}

// `after` waits for what `before` has enqueued so far.
Status follow(cudaStream_t after, cudaStream_t before, cudaEvent_t e) {
  if (cudaError_t r = cudaEventRecord(e, before); r != cudaSuccess) return cudaFailed("record", r);
  if (cudaError_t r = cudaStreamWaitEvent(after, e, 0); r != cudaSuccess)
    return cudaFailed("wait", r);
  return {};
}

Status onDevice(const void* p, const char* role) {
  cudaPointerAttributes a{};
  if (p == nullptr) return {};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess || a.devicePointer == nullptr) {
    cudaGetLastError();
    return invalidArgument(std::string("tensor-parallel call: ") + role + " is not GPU memory");
  }
  return {};
}

class Run {
 public:
  Run(Communicator& comm, const TpCall& x, const algo::TpPlan& plan, State& st, std::byte* ws)
      : comm_(comm),
        x_(x),
        plan_(plan),
        st_(st),
        gemmWs_(ws),
        staging_(ws + Gemms::kWorkspaceBytes),
        n_(static_cast<std::size_t>(comm.size())),
        shape_(x.shape(comm.size())),
        rows_(x.m / n_),
        es_(sizeOf(x.type)),
        stream_(static_cast<cudaStream_t>(x.stream)) {}

  Status allGatherGemm() {
    const std::size_t k = x_.k;
    const auto* a = static_cast<const std::byte*>(x_.a);
    auto* c = static_cast<std::byte*>(x_.c);
    auto* gathered = static_cast<std::byte*>(x_.gathered);
    if (Status s = follow(st_.side, stream_, st_.fork); !s) return s;
    for (int i = 0; i < plan_.chunks; ++i) {
      ChunkGemm ch = chunkGemm(shape_, x_.type, plan_.chunks, i);
      // Every rank's rows of this chunk, rank by rank; straight into the gathered A unchunked.
      std::byte* g =
          plan_.chunks == 1 && gathered != nullptr ? gathered : staging_ + ch.aOffset * es_;
      if (Status s = comm_.allGather(a + ch.start * k * es_, g, ch.rows * k, x_.type, st_.side); !s)
        return s;
      if (gathered != nullptr && g != gathered) {
        const std::size_t piece = ch.rows * k * es_;
        if (cudaError_t e = cudaMemcpy2DAsync(gathered + ch.start * k * es_, rows_ * k * es_, g,
                                              piece, piece, n_, cudaMemcpyDeviceToDevice, st_.side);
            e != cudaSuccess)
          return cudaFailed("gathered A", e);
      }
      if (Status s = follow(stream_, st_.side, st_.chunk); !s) return s;
      ch.shape.bias = x_.bias != nullptr;
      ch.shape.smCount = overlapSms(i + 1 < plan_.chunks);
      if (Status s =
              st_.gemms->run(ch.shape, g, x_.b, c + ch.cOffset * es_, x_.bias, gemmWs_, stream_);
          !s)
        return s;
    }
    return follow(stream_, st_.side, st_.join);
  }

  Status gemmReduceScatter() {
    const auto* a = static_cast<const std::byte*>(x_.a);
    auto* c = static_cast<std::byte*>(x_.c);
    // One rank adds the bias, so the sum holds it once.
    const void* bias = comm_.rank() == 0 ? x_.bias : nullptr;
    for (int i = 0; i < plan_.chunks; ++i) {
      ChunkGemm ch = chunkGemm(shape_, x_.type, plan_.chunks, i);
      std::byte* partial = staging_ + ch.cOffset * es_;
      ch.shape.bias = bias != nullptr;
      ch.shape.smCount = overlapSms(i > 0);
      if (Status s =
              st_.gemms->run(ch.shape, a + ch.aOffset * es_, x_.b, partial, bias, gemmWs_, stream_);
          !s)
        return s;
      if (Status s = follow(st_.side, stream_, st_.chunk); !s) return s;
      if (Status s = comm_.reduceScatter(partial, c + ch.start * x_.cols * es_, ch.rows * x_.cols,
                                         x_.type, RedOp::sum, st_.side);
          !s)
        return s;
    }
    return follow(stream_, st_.side, st_.join);
  }

 private:
  // The SMs a GEMM targets (WEFT_TP_GEMM_SMS where a collective runs beside it; 0: all). An
  // all-gather's last GEMM and a reduce-scatter's first run alone.
  int overlapSms(bool overlaps) const { return overlaps ? comm_.config().tpGemmSms : 0; }

  Communicator& comm_;
  const TpCall& x_;
  const algo::TpPlan& plan_;
  State& st_;
  std::byte* gemmWs_;
  std::byte* staging_;
  std::size_t n_;
  algo::TpShape shape_;
  std::size_t rows_, es_;
  cudaStream_t stream_;
};

}  // namespace

Status runTp(Communicator& comm, const TpCall& x) {
  if (Status s = checkTp(x, comm.size()); !s) return s;
  for (auto [p, role] : {std::pair<const void*, const char*>{x.a, "A"},
                         {x.b, "B"},
                         {x.c, "C"},
                         {x.gathered, "the gathered A"},
                         {x.bias, "the bias"},
                         {x.workspace, "the workspace"}}) {
    if (Status s = onDevice(p, role); !s) return s;
  }
  auto plan = comm.tpPlanFor(x.shape(comm.size()));
  if (!plan) return plan.status();
  std::byte* ws = static_cast<std::byte*>(x.workspace);
  if (ws == nullptr) {
    auto need = workspaceBytes(x.shape(comm.size()));
    if (!need) return need.status();
    auto own = comm.workspace(*need, true);
    if (!own) return own.status();
    ws = *own;
  }
  auto st = stateOf(comm);
  if (!st) return st.status();
  Run run(comm, x, *plan, **st, ws);
  // One operation of the communicator's order: a later call on any stream waits for its GEMMs
  // too, not just its collectives.
  return comm.gpuOperation(x.stream, [&] {
    return x.op == algo::TpOp::allGatherGemm ? run.allGatherGemm() : run.gemmReduceScatter();
  });
}

}  // namespace weft::fused::tp
