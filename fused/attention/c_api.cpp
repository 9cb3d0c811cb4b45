// weft.h's ring attention entry points, compiled into libweft beside src/core/c_api.cpp and
// sharing its handles and errors (src/core/c_api_calls.hpp).
#include <cmath>

#include "fused/attention/ring.hpp"
#include "src/core/c_api_calls.hpp"

using namespace weft::capi;  // NOLINT: the entry points below are its users

namespace {

// The call's description, checked for what C can get wrong before the C++ checks run.
weftResult_t ringCallOf(const char* what, const weftAttention* a,
                        weft::fused::attention::RingCall& x) {
  if (a == nullptr) return invalid(std::string(what) + ": attention is NULL");
  if (!validType(a->datatype))
    return invalid(std::string(what) + ": invalid datatype " +
                   std::to_string(static_cast<int>(a->datatype)));
  if (a->causal != 0 && a->causal != 1)
    return invalid(std::string(what) + ": causal must be 0 or 1");
  if (!(a->softmaxScale >= 0) || std::isinf(a->softmaxScale))
    return invalid(std::string(what) + ": softmaxScale must be finite and not negative");
  weft::fused::attention::LocalAttention& l = x.local;
  l.q = a->q, l.k = a->k, l.v = a->v;
  l.cuSeqlensQ = l.cuSeqlensK = a->cuSeqlens;
  l.sequences = a->sequences;
  l.tokensQ = a->tokens, l.maxSeqlenQ = a->maxSeqlen;
  l.heads = a->heads, l.kvHeads = a->kvHeads, l.dim = a->headDim;
  l.type = static_cast<weft::DataType>(a->datatype);
  l.scale = a->softmaxScale > 0
                ? a->softmaxScale
                : 1.0f / std::sqrt(static_cast<float>(a->headDim > 0 ? a->headDim : 1));
  l.out = a->out, l.lse = a->lse;
  x.causal = a->causal == 1;
  return weftSuccess;
}

// A pass's workspace bytes, from the description alone (`layout`: ringWorkspace or
// ringBackwardWorkspace).
template <typename Layout>
weftResult_t workspaceSize(const char* what, const weftAttention* attention, weftComm_t comm,
                           size_t* bytes, Layout layout) {
  weft::fused::attention::RingCall x;
  if (weftResult_t r = ringCallOf(what, attention, x); r != weftSuccess) return r;
  if (bytes == nullptr) return invalid(std::string(what) + ": bytes is NULL");
  return withComm(comm, what, [&](weft::Communicator&) -> weft::Status {
    if (weft::Status s = weft::fused::attention::checkLocal(x.local); !s) return s;
    auto w = layout(x.local);
    if (!w) return w.status();
    *bytes = w->total;
    return {};
  });
}

}  // namespace

extern "C" {

weftResult_t weftRingAttention(const weftAttention* attention, void* workspace,
                               size_t workspaceBytes, weftComm_t comm, void* stream) {
  const char* what = "weftRingAttention";
  weft::fused::attention::RingCall x;
  if (weftResult_t r = ringCallOf(what, attention, x); r != weftSuccess) return r;
  x.workspace = workspace, x.workspaceBytes = workspaceBytes, x.stream = stream;
  if (gGroupDepth > 0) return fail(weftInvalidUsage, std::string(what) + ": not inside a group");
  return withComm(comm, what,
                  [&](weft::Communicator& c) { return weft::fused::attention::runRing(c, x); });
}

weftResult_t weftRingAttentionWorkspaceSize(const weftAttention* attention, weftComm_t comm,
                                            size_t* bytes) {
  return workspaceSize("weftRingAttentionWorkspaceSize", attention, comm, bytes,
                       weft::fused::attention::ringWorkspace);
}

weftResult_t weftRingAttentionBackward(const weftAttention* attention,
                                       const weftAttentionGrads* grads, void* workspace,
                                       size_t workspaceBytes, weftComm_t comm, void* stream) {
  const char* what = "weftRingAttentionBackward";
  weft::fused::attention::RingCall x;
  if (weftResult_t r = ringCallOf(what, attention, x); r != weftSuccess) return r;
  if (grads == nullptr) return invalid(std::string(what) + ": grads is NULL");
  x.workspace = workspace, x.workspaceBytes = workspaceBytes, x.stream = stream;
  const weft::fused::attention::RingGrads g{grads->dOut, grads->dq, grads->dk, grads->dv};
  if (gGroupDepth > 0) return fail(weftInvalidUsage, std::string(what) + ": not inside a group");
  return withComm(comm, what, [&](weft::Communicator& c) {
    return weft::fused::attention::runRingBackward(c, x, g);
  });
}

weftResult_t weftRingAttentionBackwardWorkspaceSize(const weftAttention* attention, weftComm_t comm,
                                                    size_t* bytes) {
  return workspaceSize("weftRingAttentionBackwardWorkspaceSize", attention, comm, bytes,
                       weft::fused::attention::ringBackwardWorkspace);
}

weftResult_t weftZigzagLocal(const int32_t* cuSeqlens, int sequences, int nranks, int rank,
                             int32_t* localCuSeqlens, int32_t* positions) {
  if (cuSeqlens == nullptr || localCuSeqlens == nullptr)
    return invalid("weftZigzagLocal: cuSeqlens and localCuSeqlens must not be NULL");
  const weft::Status s = weft::fused::attention::zigzagLocal(cuSeqlens, sequences, nranks, rank,
                                                             localCuSeqlens, positions);
  if (!s) return invalid("weftZigzagLocal: " + s.message());
  return weftSuccess;
}

}  // extern "C"
