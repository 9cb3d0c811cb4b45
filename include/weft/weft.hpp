// The C++ API: a communicator that owns its handle, typed collectives, and errors as Status.
// A thin layer over weft.h, so C and C++ users run the same code.
//
//   auto id = weft::UniqueId::make();                 // on one rank, then share it
//   auto comm = weft::Comm::initRank(nranks, *id, rank);
//   comm->allReduce(in.data(), out.data(), in.size(), weft::RedOp::sum);
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "weft/status.hpp"
#include "weft/types.hpp"
#include "weft/weft.h"

namespace weft {

// The C++ type of each DataType (half types as their bit patterns).
template <typename T>
constexpr DataType dataTypeOf() {
  if constexpr (std::is_same_v<T, double>)
    return DataType::f64;
  else if constexpr (std::is_same_v<T, float>)
    return DataType::f32;
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return DataType::i8;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return DataType::u8;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return DataType::i32;
  else if constexpr (std::is_same_v<T, std::uint32_t>)
    return DataType::u32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return DataType::i64;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return DataType::u64;
  else
    static_assert(sizeof(T) == 0, "no weft DataType for this C++ type; pass the DataType");
}

namespace detail {
inline Status status(weftResult_t r) {
  return r == weftSuccess ? Status{} : Status(static_cast<Code>(r), weftGetLastError());
}
inline weftDataType_t c(DataType t) {
  return static_cast<weftDataType_t>(t);
}
inline weftRedOp_t c(RedOp op) {
  return static_cast<weftRedOp_t>(op);
}
}  // namespace detail

struct UniqueId {
  weftUniqueId id{};
  static Result<UniqueId> make() {
    UniqueId u;
    if (Status s = detail::status(weftGetUniqueId(&u.id)); !s) return s;
    return u;
  }
};

// Device memory a tensor-parallel call may use (Comm::allGatherGemm): Comm::tpWorkspaceSize
// bytes; none takes the communicator's own.
struct TpWorkspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// A MoE dispatch's layout (weft.h, weftMoeDispatch), which its combine takes; owned.
class MoeHandle {
 public:
  MoeHandle() = default;
  explicit MoeHandle(weftMoeHandle_t h) : h_(h) {}
  MoeHandle(MoeHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  MoeHandle& operator=(MoeHandle&& o) noexcept {
    if (this != &o) {
      (void)weftMoeHandleDestroy(h_);
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  MoeHandle(const MoeHandle&) = delete;
  MoeHandle& operator=(const MoeHandle&) = delete;
  ~MoeHandle() { (void)weftMoeHandleDestroy(h_); }
  weftMoeHandle_t get() const { return h_; }
  // The rows dispatch wrote (and combine reads).
  std::size_t rows() const {
    std::size_t r = 0;
    (void)weftMoeRows(h_, &r);
    return r;
  }

 private:
  weftMoeHandle_t h_ = nullptr;
};

class Comm {
 public:
  static Result<Comm> initRank(int nranks, const UniqueId& id, int rank) {
    weftComm_t h = nullptr;
    if (Status s = detail::status(weftCommInitRank(&h, nranks, id.id, rank)); !s) return s;
    return Comm(h);
  }
  // Every rank in this process; then drive each from its own thread.
  static Result<std::vector<Comm>> initAll(int nranks) {
    std::vector<weftComm_t> h(static_cast<std::size_t>(nranks > 0 ? nranks : 0));
    if (Status s = detail::status(weftCommInitAll(h.data(), nranks)); !s) return s;
    std::vector<Comm> out;
    for (weftComm_t c : h) out.push_back(Comm(c));
    return out;
  }

  Comm(Comm&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Comm& operator=(Comm&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm() { reset(); }

  // A new communicator of the ranks passing the same color (ranked by key); a negative color
  // takes part and gets an empty Comm.
  Result<Comm> split(int color, int key) {
    weftComm_t h = nullptr;
    if (Status s =
            detail::status(weftCommSplit(h_, color < 0 ? WEFT_SPLIT_NOCOLOR : color, key, &h));
        !s)
      return s;
    return Comm(h);
  }
  bool valid() const { return h_ != nullptr; }

  weftComm_t handle() const { return h_; }
  int rank() const {
    int r = -1;
    (void)weftCommUserRank(h_, &r);
    return r;
  }
  int size() const {
    int n = 0;
    (void)weftCommCount(h_, &n);
    return n;
  }
  std::string summary() const { return weftCommSummary(h_); }
  Status abort() { return detail::status(weftCommAbort(h_)); }

  // Host buffers block and take no stream; GPU buffers are enqueued on `stream` (a
  // cudaStream_t) and return at once (weft.h says more).
  Status allReduce(const void* send, void* recv, std::size_t count, DataType t, RedOp op,
                   void* stream = nullptr) {
    return detail::status(
        weftAllReduce(send, recv, count, detail::c(t), detail::c(op), h_, stream));
  }
  Status allGather(const void* send, void* recv, std::size_t count, DataType t,
                   void* stream = nullptr) {
    return detail::status(weftAllGather(send, recv, count, detail::c(t), h_, stream));
  }
  Status reduceScatter(const void* send, void* recv, std::size_t count, DataType t, RedOp op,
                       void* stream = nullptr) {
    return detail::status(
        weftReduceScatter(send, recv, count, detail::c(t), detail::c(op), h_, stream));
  }
  Status broadcast(const void* send, void* recv, std::size_t count, DataType t, int root,
                   void* stream = nullptr) {
    return detail::status(weftBroadcast(send, recv, count, detail::c(t), root, h_, stream));
  }
  Status reduce(const void* send, void* recv, std::size_t count, DataType t, RedOp op, int root,
                void* stream = nullptr) {
    return detail::status(
        weftReduce(send, recv, count, detail::c(t), detail::c(op), root, h_, stream));
  }
  Status allToAll(const void* send, void* recv, std::size_t count, DataType t,
                  void* stream = nullptr) {
    return detail::status(weftAllToAll(send, recv, count, detail::c(t), h_, stream));
  }
  // What stopped a GPU call after it was enqueued (timeout, abort), or ok.
  Status asyncError() const {
    weftResult_t r = weftSuccess;
    if (Status s = detail::status(weftCommGetAsyncError(h_, &r)); !s) return s;
    return detail::status(r);
  }
  // The GPU the communicator's GPU transport uses (-1 before its first GPU call).
  int device() const {
    int d = -1;
    (void)weftCommDevice(h_, &d);
    return d;
  }
  Status send(const void* buf, std::size_t count, DataType t, int peer, void* stream = nullptr) {
    return detail::status(weftSend(buf, count, detail::c(t), peer, h_, stream));
  }
  Status recv(void* buf, std::size_t count, DataType t, int peer, void* stream = nullptr) {
    return detail::status(weftRecv(buf, count, detail::c(t), peer, h_, stream));
  }
  Status barrier() { return detail::status(weftBarrier(h_, nullptr)); }
  // A GPU buffer collectives may read in place on the peers (weftCommRegister); the handle goes
  // back to deregisterBuffer.
  Result<void*> registerBuffer(void* buf, std::size_t bytes) {
    void* h = nullptr;
    if (Status s = detail::status(weftCommRegister(h_, buf, bytes, &h)); !s) return s;
    return h;
  }
  Status deregisterBuffer(void* handle) { return detail::status(weftCommDeregister(h_, handle)); }

  // Compressed collectives (weft.h, "compressed collectives"): `compression` null takes the
  // communicator's default (setCompression, WEFT_COMPRESS).
  Status allReduce(const void* send, void* recv, std::size_t count, DataType t, RedOp op,
                   const weftCompression* compression, void* stream = nullptr) {
    return detail::status(
        weftAllReduceEx(send, recv, count, detail::c(t), detail::c(op), h_, stream, compression));
  }
  Status reduceScatter(const void* send, void* recv, std::size_t count, DataType t, RedOp op,
                       const weftCompression* compression, void* stream = nullptr) {
    return detail::status(weftReduceScatterEx(send, recv, count, detail::c(t), detail::c(op), h_,
                                              stream, compression));
  }
  Status allGather(const void* send, void* recv, std::size_t count, DataType t,
                   const weftCompression* compression, void* stream = nullptr) {
    return detail::status(
        weftAllGatherEx(send, recv, count, detail::c(t), h_, stream, compression));
  }
  Status setCompression(const weftCompression* compression) {
    return detail::status(weftCommSetCompression(h_, compression));
  }

  // Tensor-parallel GEMMs with their collective (weft.h, "tensor-parallel GEMMs"): m, n and k
  // are the whole GEMM's; a workspace of no bytes takes the communicator's.
  Status allGatherGemm(const void* aShard, const void* b, void* c, std::size_t m, std::size_t n,
                       std::size_t k, DataType t, void* stream, void* aGathered = nullptr,
                       const void* bias = nullptr, TpWorkspace ws = {}) {
    return detail::status(weftAllGatherGemm(aShard, b, c, aGathered, bias, m, n, k, detail::c(t),
                                            ws.data, ws.bytes, h_, stream));
  }
  Status gemmReduceScatter(const void* a, const void* b, void* c, std::size_t m, std::size_t n,
                           std::size_t k, DataType t, void* stream, const void* bias = nullptr,
                           TpWorkspace ws = {}) {
    return detail::status(
        weftGemmReduceScatter(a, b, c, bias, m, n, k, detail::c(t), ws.data, ws.bytes, h_, stream));
  }
  // The fp8 forms (weft.h, weftAllGatherGemmFp8): B given transposed, C of fp8.output.
  Status allGatherGemmFp8(const void* aShard, const void* bT, void* c, std::size_t m, std::size_t n,
                          std::size_t k, const weftTpFp8& fp8, void* stream,
                          void* aGathered = nullptr, const void* bias = nullptr,
                          TpWorkspace ws = {}) {
    return detail::status(weftAllGatherGemmFp8(aShard, bT, c, aGathered, bias, m, n, k,
                                               weftFloat8e4m3, &fp8, ws.data, ws.bytes, h_,
                                               stream));
  }
  Status gemmReduceScatterFp8(const void* a, const void* bT, void* c, std::size_t m, std::size_t n,
                              std::size_t k, const weftTpFp8& fp8, void* stream,
                              const void* bias = nullptr, TpWorkspace ws = {}) {
    return detail::status(weftGemmReduceScatterFp8(a, bT, c, bias, m, n, k, weftFloat8e4m3, &fp8,
                                                   ws.data, ws.bytes, h_, stream));
  }
  Result<std::size_t> tpWorkspaceSize(weftTpOp_t op, std::size_t m, std::size_t n, std::size_t k,
                                      DataType t) {
    std::size_t bytes = 0;
    if (Status s = detail::status(weftTpWorkspaceSize(h_, op, m, n, k, detail::c(t), &bytes)); !s)
      return s;
    return bytes;
  }
  // Ring attention's forward pass (weft.h, weftRingAttention) on this rank's zigzag share.
  Status ringAttention(const weftAttention& attention, void* stream, TpWorkspace ws = {}) {
    return detail::status(weftRingAttention(&attention, ws.data, ws.bytes, h_, stream));
  }
  Result<std::size_t> ringAttentionWorkspaceSize(const weftAttention& attention) {
    std::size_t bytes = 0;
    if (Status s = detail::status(weftRingAttentionWorkspaceSize(&attention, h_, &bytes)); !s)
      return s;
    return bytes;
  }
  // Its backward pass (weftRingAttentionBackward).
  Status ringAttentionBackward(const weftAttention& attention, const weftAttentionGrads& grads,
                               void* stream, TpWorkspace ws = {}) {
    return detail::status(
        weftRingAttentionBackward(&attention, &grads, ws.data, ws.bytes, h_, stream));
  }
  Result<std::size_t> ringAttentionBackwardWorkspaceSize(const weftAttention& attention) {
    std::size_t bytes = 0;
    if (Status s = detail::status(weftRingAttentionBackwardWorkspaceSize(&attention, h_, &bytes));
        !s)
      return s;
    return bytes;
  }

  // MoE dispatch (weftMoeDispatch): the rows grouped by local expert, and the handle combine
  // takes.
  Result<MoeHandle> moeDispatch(const weftMoeDispatchArgs& args, void* stream = nullptr) {
    weftMoeHandle_t h = nullptr;
    if (Status s = detail::status(weftMoeDispatch(&args, &h, h_, stream)); !s) return s;
    return MoeHandle(h);
  }
  // MoE combine (weftMoeCombine): out = each token's weighted sum of its experts' rows.
  Status moeCombine(const MoeHandle& handle, const void* expertOut, void* out,
                    void* stream = nullptr) {
    return detail::status(weftMoeCombine(handle.get(), expertOut, out, h_, stream));
  }
  // The same in halves (weftMoeDispatchSend ... weftMoeCombineRecv): work put on `stream`
  // between a send and its receive overlaps the transfer.
  Result<MoeHandle> moeDispatchSend(const weftMoeDispatchArgs& args, void* stream = nullptr) {
    weftMoeHandle_t h = nullptr;
    if (Status s = detail::status(weftMoeDispatchSend(&args, &h, h_, stream)); !s) return s;
    return MoeHandle(h);
  }
  Status moeDispatchRecv(const MoeHandle& handle, void* stream = nullptr) {
    return detail::status(weftMoeDispatchRecv(handle.get(), h_, stream));
  }
  Status moeCombineSend(const MoeHandle& handle, const void* expertOut, void* stream = nullptr) {
    return detail::status(weftMoeCombineSend(handle.get(), expertOut, h_, stream));
  }
  Status moeCombineRecv(const MoeHandle& handle, void* out, void* stream = nullptr) {
    return detail::status(weftMoeCombineRecv(handle.get(), out, h_, stream));
  }

  // Typed forms: the DataType follows from T.
  template <typename T>
  Status allReduce(const T* send, T* recv, std::size_t count, RedOp op, void* stream = nullptr) {
    return allReduce(send, recv, count, dataTypeOf<T>(), op, stream);
  }

 private:
  explicit Comm(weftComm_t h) : h_(h) {}
  void reset() {
    if (h_ != nullptr) (void)weftCommDestroy(h_);
    h_ = nullptr;
  }
  weftComm_t h_ = nullptr;
};

// "fp8e4m3:32", "e5m2:128:always", "none": weftCompressionParse.
inline Result<weftCompression> compression(const std::string& text) {
  weftCompression c{};
  if (Status s = detail::status(weftCompressionParse(text.c_str(), &c)); !s) return s;
  return c;
}

// Host memory the communicator's other processes on this host read in place (weftHostAlloc);
// freed with hostFree.
inline Result<void*> hostAlloc(std::size_t bytes) {
  void* p = nullptr;
  if (Status s = detail::status(weftHostAlloc(&p, bytes)); !s) return s;
  return p;
}
inline Status hostFree(void* p) {
  return detail::status(weftHostFree(p));
}

}  // namespace weft
