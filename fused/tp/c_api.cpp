// weft.h's tensor-parallel entry points, compiled into libweft beside src/core/c_api.cpp and
// sharing its handles and errors (src/core/c_api_calls.hpp).
#include <cstdio>

#include "fused/tp/overlap.hpp"
#include "src/core/c_api_calls.hpp"

using namespace weft::capi;  // NOLINT: the entry points below are its users

namespace {

weftResult_t checkType(const char* what, weftDataType_t type) {
  if (!validType(type))
    return invalid(std::string(what) + ": invalid datatype " +
                   std::to_string(static_cast<int>(type)));
  return weftSuccess;
}

// The fp8 calls' own: e4m3 A and B, the scales and C's type given.
weftResult_t checkFp8(const char* what, weftDataType_t type, const weftTpFp8* fp8) {
  if (fp8 == nullptr) return invalid(std::string(what) + ": fp8 is NULL");
  if (type != weftFloat8e4m3)
    return invalid(std::string(what) + ": A and B must be weftFloat8e4m3 (got " +
                   (validType(type) ? std::string(weft::name(static_cast<weft::DataType>(type)))
                                    : std::to_string(static_cast<int>(type))) +
                   "; the calls without Fp8 multiply the others)");
  if (fp8->scaling != weftTpFp8PerTensor && fp8->scaling != weftTpFp8Block128)
    return invalid(std::string(what) + ": invalid fp8 scaling " +
                   std::to_string(static_cast<int>(fp8->scaling)));
  return checkType(what, fp8->output);
}

weftResult_t checkOp(const char* what, weftTpOp_t op) {
  if (static_cast<int>(op) < 0 || op >= weftNumTpOps)
    return invalid(std::string(what) + ": invalid op " + std::to_string(static_cast<int>(op)));
  return weftSuccess;
}

weftResult_t runTp(const char* what, weftComm_t comm, const weft::fused::tp::TpCall& call,
                   weftDataType_t type) {
  if (weftResult_t r = checkType(what, type); r != weftSuccess) return r;
  if (gGroupDepth > 0) return fail(weftInvalidUsage, std::string(what) + ": not inside a group");
  return withComm(comm, what,
                  [&](weft::Communicator& c) { return weft::fused::tp::runTp(c, call); });
}

// C's type for calls of A's `type` without fp8's own: the same; fp8's: 2 bytes, as bf16.
weftDataType_t outOf(weftDataType_t type) {
  return type == weftFloat8e4m3 ? weftBfloat16 : type;
}

weft::fused::tp::TpCall callOf(weft::algo::TpOp op, const void* a, const void* b, void* c,
                               void* gathered, const void* bias, size_t m, size_t n, size_t k,
                               weftDataType_t type, void* workspace, size_t workspaceBytes,
                               void* stream, weftDataType_t out) {
  weft::fused::tp::TpCall x;
  x.op = op;
  x.a = a;
  x.b = b;
  x.c = c;
  x.gathered = gathered;
  x.bias = bias;
  x.m = m;
  x.cols = n;
  x.k = k;
  x.type = static_cast<weft::DataType>(type);
  x.out = static_cast<weft::DataType>(out);
  x.workspace = workspace;
  x.workspaceBytes = workspaceBytes;
  x.stream = stream;
  return x;
}

weft::algo::TpShape shapeOf(weftTpOp_t op, size_t m, size_t n, size_t k, weftDataType_t type,
                            int nranks) {
  return {op == weftTpAllGatherGemm ? weft::algo::TpOp::allGatherGemm
                                    : weft::algo::TpOp::gemmReduceScatter,
          m,
          n,
          k,
          weft::sizeOf(static_cast<weft::DataType>(type)),
          nranks,
          weft::sizeOf(static_cast<weft::DataType>(outOf(type)))};
}

// The fp8 calls: checked, then run with C of fp8->output and the scales.
weftResult_t runFp8(const char* what, weft::algo::TpOp op, const void* a, const void* bT, void* c,
                    void* gathered, const void* bias, size_t m, size_t n, size_t k,
                    weftDataType_t datatype, const weftTpFp8* fp8, void* workspace,
                    size_t workspaceBytes, weftComm_t comm, void* stream) {
  if (weftResult_t r = checkFp8(what, datatype, fp8); r != weftSuccess) return r;
  auto call = callOf(op, a, bT, c, gathered, bias, m, n, k, datatype, workspace, workspaceBytes,
                     stream, fp8->output);
  call.scales = {fp8->aScale, fp8->bScale};
  call.blockScales = fp8->scaling == weftTpFp8Block128;
  call.gatheredScales = fp8->aScaleGathered;
  return runTp(what, comm, call, datatype);
}

}  // namespace

extern "C" {

weftResult_t weftAllGatherGemm(const void* aShard, const void* b, void* c, void* aGathered,
                               const void* bias, size_t m, size_t n, size_t k,
                               weftDataType_t datatype, void* workspace, size_t workspaceBytes,
                               weftComm_t comm, void* stream) {
  const auto call = callOf(weft::algo::TpOp::allGatherGemm, aShard, b, c, aGathered, bias, m, n, k,
                           datatype, workspace, workspaceBytes, stream, datatype);
  return runTp("weftAllGatherGemm", comm, call, datatype);
}

weftResult_t weftAllGatherGemmFp8(const void* aShard, const void* bT, void* c, void* aGathered,
                                  const void* bias, size_t m, size_t n, size_t k,
                                  weftDataType_t datatype, const weftTpFp8* fp8, void* workspace,
                                  size_t workspaceBytes, weftComm_t comm, void* stream) {
  return runFp8("weftAllGatherGemmFp8", weft::algo::TpOp::allGatherGemm, aShard, bT, c, aGathered,
                bias, m, n, k, datatype, fp8, workspace, workspaceBytes, comm, stream);
}

weftResult_t weftGemmReduceScatter(const void* a, const void* b, void* c, const void* bias,
                                   size_t m, size_t n, size_t k, weftDataType_t datatype,
                                   void* workspace, size_t workspaceBytes, weftComm_t comm,
                                   void* stream) {
  const auto call = callOf(weft::algo::TpOp::gemmReduceScatter, a, b, c, nullptr, bias, m, n, k,
                           datatype, workspace, workspaceBytes, stream, datatype);
  return runTp("weftGemmReduceScatter", comm, call, datatype);
}

weftResult_t weftGemmReduceScatterFp8(const void* a, const void* bT, void* c, const void* bias,
                                      size_t m, size_t n, size_t k, weftDataType_t datatype,
                                      const weftTpFp8* fp8, void* workspace, size_t workspaceBytes,
                                      weftComm_t comm, void* stream) {
  return runFp8("weftGemmReduceScatterFp8", weft::algo::TpOp::gemmReduceScatter, a, bT, c, nullptr,
                bias, m, n, k, datatype, fp8, workspace, workspaceBytes, comm, stream);
}

weftResult_t weftTpWorkspaceSize(weftComm_t comm, weftTpOp_t op, size_t m, size_t n, size_t k,
                                 weftDataType_t datatype, size_t* bytes) {
  const char* what = "weftTpWorkspaceSize";
  if (weftResult_t r = checkOp(what, op); r != weftSuccess) return r;
  if (weftResult_t r = checkType(what, datatype); r != weftSuccess) return r;
  if (bytes == nullptr) return invalid("weftTpWorkspaceSize: bytes is NULL");
  return withComm(comm, what, [&](weft::Communicator& c) -> weft::Status {
    const auto shape = shapeOf(op, m, n, k, datatype, c.size());
    auto need =
        weft::fused::tp::workspaceBytes(shape, weft::fused::tp::gemmStreams(c.config(), shape.op));
    if (!need) return need.status();
    *bytes = *need;
    return {};
  });
}

weftResult_t weftTpPlan(weftComm_t comm, weftTpOp_t op, size_t m, size_t n, size_t k,
                        weftDataType_t datatype, char* buf, size_t len) {
  const char* what = "weftTpPlan";
  if (weftResult_t r = checkOp(what, op); r != weftSuccess) return r;
  if (weftResult_t r = checkType(what, datatype); r != weftSuccess) return r;
  if (buf == nullptr || len == 0) return invalid("weftTpPlan: buf is NULL or len is 0");
  return withComm(comm, what, [&](weft::Communicator& c) -> weft::Status {
    // The shape is what is checked: any buffers do.
    const auto probe = callOf(shapeOf(op, m, n, k, datatype, c.size()).op, buf, buf, buf, nullptr,
                              nullptr, m, n, k, datatype, nullptr, 0, nullptr, outOf(datatype));
    if (weft::Status s = weft::fused::tp::checkTp(
            probe, c.size(), weft::fused::tp::gemmStreams(c.config(), probe.op));
        !s)
      return s;
    auto plan = c.tpPlanFor(probe.shape(c.size()));
    if (!plan) return plan.status();
    std::snprintf(buf, len, "%s", plan->name().c_str());
    return {};
  });
}

}  // extern "C"
