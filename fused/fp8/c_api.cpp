// weft.h's compressed collectives: the C entry points, compiled into libweft beside
// src/core/c_api.cpp and sharing its handles, errors and groups (src/core/c_api_calls.hpp).
#include <cstdio>
#include <cstring>

#include "algorithms/compression.hpp"
#include "fused/fp8/compressed.hpp"
#include "src/core/c_api_calls.hpp"

using namespace weft::capi;  // NOLINT: the entry points below are its users

namespace {

// The compression an Ex call runs with: `given` (checked), else the communicator's default.
weftResult_t checkGiven(const char* what, const weftCompression* given) {
  if (given == nullptr) return weftSuccess;
  return report(weft::checkCompression(*given, what));
}

weftResult_t compressible(weftComm_t comm, const char* what, weft::Collective coll,
                          const void* send, const void* recv, size_t count, weftDataType_t type,
                          weftRedOp_t op, void* stream, const weftCompression* given) {
  if (weftResult_t r = checkArgs(what, type, op, stream); r != weftSuccess) return r;
  if (weftResult_t r = checkGiven(what, given); r != weftSuccess) return r;
  std::optional<weftCompression> asked;
  if (given != nullptr) asked = *given;
  weft::fused::fp8::CompressedCall call{coll,
                                        send,
                                        const_cast<void*>(recv),
                                        count,
                                        static_cast<weft::DataType>(type),
                                        static_cast<weft::RedOp>(op),
                                        stream};
  return collective(comm, what, checked(coll, send, recv, count, type, 0),
                    [=](weft::Communicator& c) {
                      return weft::fused::fp8::runCompressible(
                          c, call, asked ? *asked : c.compression(), asked.has_value());
                    });
}

}  // namespace

extern "C" {

weftResult_t weftCompressionParse(const char* text, weftCompression* compression) {
  if (compression == nullptr) return invalid("weftCompressionParse: compression is NULL");
  auto parsed = weft::parseCompression(text == nullptr ? "" : text);
  if (!parsed)
    return report(
        weft::Status(parsed.status().code(), "weftCompressionParse: " + parsed.status().message()));
  *compression = *parsed;
  return weftSuccess;
}

weftResult_t weftCommSetCompression(weftComm_t comm, const weftCompression* compression) {
  if (weftResult_t r = checkGiven("weftCommSetCompression", compression); r != weftSuccess)
    return r;
  const weftCompression c = compression != nullptr
                                ? *compression
                                : weftCompression{weftCompressNone, weftScaleE8M0, 0, 0};
  return withComm(comm, "weftCommSetCompression", [&](weft::Communicator& x) {
    x.setCompression(c);
    return weft::Status{};
  });
}

weftResult_t weftCommGetCompression(weftComm_t comm, weftCompression* compression) {
  if (compression == nullptr) return invalid("weftCommGetCompression: compression is NULL");
  return withComm(comm, "weftCommGetCompression", [&](weft::Communicator& x) {
    *compression = x.compression();
    return weft::Status{};
  });
}

weftResult_t weftAllReduceEx(const void* sendbuff, void* recvbuff, size_t count,
                             weftDataType_t datatype, weftRedOp_t op, weftComm_t comm, void* stream,
                             const weftCompression* compression) {
  return compressible(comm, "weftAllReduceEx", weft::Collective::allReduce, sendbuff, recvbuff,
                      count, datatype, op, stream, compression);
}

weftResult_t weftReduceScatterEx(const void* sendbuff, void* recvbuff, size_t recvcount,
                                 weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                                 void* stream, const weftCompression* compression) {
  return compressible(comm, "weftReduceScatterEx", weft::Collective::reduceScatter, sendbuff,
                      recvbuff, recvcount, datatype, op, stream, compression);
}

weftResult_t weftAllGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount,
                             weftDataType_t datatype, weftComm_t comm, void* stream,
                             const weftCompression* compression) {
  return compressible(comm, "weftAllGatherEx", weft::Collective::allGather, sendbuff, recvbuff,
                      sendcount, datatype, weftSum, stream, compression);
}

weftResult_t weftCommPlanEx(weftComm_t comm, weftCollective_t coll, size_t count,
                            weftDataType_t datatype, weftMemory_t memory,
                            const weftCompression* compression, char* buf, size_t len) {
  if (coll != weftCollAllReduce && coll != weftCollReduceScatter && coll != weftCollAllGather)
    return weftCommPlanMemory(comm, coll, count, datatype, memory, buf, len);
  if (memory != weftHostMemory && memory != weftGpuMemory)
    return invalid("weftCommPlanEx: invalid memory " + std::to_string(static_cast<int>(memory)));
  if (weftResult_t r = checkArgs("weftCommPlanEx", datatype, weftSum, nullptr); r != weftSuccess)
    return r;
  if (weftResult_t r = checkGiven("weftCommPlanEx", compression); r != weftSuccess) return r;
  if (buf == nullptr || len == 0) return invalid("weftCommPlanEx: buf is NULL or len is 0");
  return withComm(comm, "weftCommPlanEx", [&](weft::Communicator& c) -> weft::Status {
    auto plan = weft::fused::fp8::planCompressible(
        c, static_cast<weft::Collective>(coll), count, static_cast<weft::DataType>(datatype),
        memory == weftGpuMemory, compression != nullptr ? *compression : c.compression());
    if (!plan) return plan.status();
    const std::string algorithm =
        plan->codec.empty() ? plan->algorithm : plan->algorithm + " " + plan->codec;
    std::snprintf(buf, len, "%s/%s", algorithm.c_str(),
                  std::string(weft::algo::name(plan->protocol)).c_str());
    return {};
  });
}

}  // extern "C"
