#include "fused/fp8/compressed.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "fused/fp8/values.hpp"

namespace weft::fused::fp8 {
namespace {

Status fromC(weftResult_t r, const char* what) {
  if (r == weftSuccess) return {};
  return Status(static_cast<Code>(r), std::string(what) + ": " + weftGetLastError());
}

Status checkArgs(const Codec& codec, DataType type, const char* what) {
  if (!encodable(type))
    return invalidArgument(std::string(what) + " " + codec.name() + ": " + std::string(name(type)) +
                           " cannot be compressed (bf16, f16 and f32 can)");
  return {};
}

Status checkOp(const Codec& codec, RedOp op, const char* what) {
  if (op == RedOp::sum || op == RedOp::avg) return {};
  return invalidArgument(std::string(what) + " " + codec.name() + ": " + std::string(name(op)) +
                         " cannot be compressed (sum and avg can: scaled blocks cannot be "
                         "multiplied or compared exactly)");
}

// This rank's share of the reduction, in f32: every rank's `share` values for it, encoded
// chunk by chunk (a block never spans two ranks' shares), exchanged, decoded and added in rank
// order.
Status reduceShare(weftComm_t comm, const Codec& codec, DataType type, RedOp op, const void* send,
                   std::size_t share, std::vector<float>& sums) {
  int n = 0;
  if (Status s = fromC(weftCommCount(comm, &n), "fp8 reduce-scatter"); !s) return s;
  const std::size_t encoded = codec.encodedBytes(share);
  const std::size_t size = sizeOf(type);
  std::vector<std::byte> out(encoded * static_cast<std::size_t>(n)), in(out.size());
  for (int q = 0; q < n; ++q) {
    const auto* chunk =
        static_cast<const std::byte*>(send) + static_cast<std::size_t>(q) * share * size;
    if (Status s =
            encode(codec, type, chunk, share, out.data() + static_cast<std::size_t>(q) * encoded);
        !s)
      return s;
  }
  if (Status s = fromC(weftAllToAll(out.data(), in.data(), encoded, weftUint8, comm, nullptr),
                       "fp8 reduce-scatter");
      !s)
    return s;
  sums.assign(share, 0.0f);
  std::vector<float> part(share);
  for (int r = 0; r < n; ++r) {
    if (Status s = decode(codec, DataType::f32, in.data() + static_cast<std::size_t>(r) * encoded,
                          share, part.data());
        !s)
      return s;
    for (std::size_t i = 0; i < share; ++i) sums[i] += part[i];
  }
  if (op == RedOp::avg) {
    for (float& x : sums) x /= static_cast<float>(n);
  }
  return {};
}

// Every rank's `count` values of `type` as `codec` bytes, gathered and decoded into `recv`
// (count values a rank); `encodedMine` is this rank's encoding.
Status gatherEncoded(weftComm_t comm, const Codec& codec, DataType type,
                     const std::vector<std::byte>& encodedMine, std::size_t count, std::size_t keep,
                     void* recv) {
  int n = 0;
  if (Status s = fromC(weftCommCount(comm, &n), "fp8 all-gather"); !s) return s;
  const std::size_t encoded = encodedMine.size();
  std::vector<std::byte> all(encoded * static_cast<std::size_t>(n));
  if (Status s =
          fromC(weftAllGather(encodedMine.data(), all.data(), encoded, weftUint8, comm, nullptr),
                "fp8 all-gather");
      !s)
    return s;
  const std::size_t size = sizeOf(type);
  std::vector<std::byte> values(count * size);
  std::size_t done = 0;
  for (int r = 0; r < n && done < keep; ++r) {
    if (Status s = decode(codec, type, all.data() + static_cast<std::size_t>(r) * encoded, count,
                          values.data());
        !s)
      return s;
    const std::size_t take = std::min(count, keep - done);
    std::memcpy(static_cast<std::byte*>(recv) + done * size, values.data(), take * size);
    done += take;
  }
  return {};
}

}  // namespace

Status compressedAllGather(weftComm_t comm, const Codec& codec, DataType type, const void* send,
                           void* recv, std::size_t sendcount) {
  if (Status s = checkArgs(codec, type, "fp8 all-gather"); !s) return s;
  int n = 0;
  if (Status s = fromC(weftCommCount(comm, &n), "fp8 all-gather"); !s) return s;
  std::vector<std::byte> mine(codec.encodedBytes(sendcount));
  if (Status s = encode(codec, type, send, sendcount, mine.data()); !s) return s;
  return gatherEncoded(comm, codec, type, mine, sendcount, sendcount * static_cast<std::size_t>(n),
                       recv);
}

Status compressedReduceScatter(weftComm_t comm, const Codec& codec, DataType type, RedOp op,
                               const void* send, void* recv, std::size_t recvcount) {
  if (Status s = checkArgs(codec, type, "fp8 reduce-scatter"); !s) return s;
  if (Status s = checkOp(codec, op, "fp8 reduce-scatter"); !s) return s;
  std::vector<float> sums;
  if (Status s = reduceShare(comm, codec, type, op, send, recvcount, sums); !s) return s;
  for (std::size_t i = 0; i < recvcount; ++i) storeValue(type, recv, i, sums[i]);
  return {};
}

Status compressedAllReduce(weftComm_t comm, const Codec& codec, DataType type, RedOp op,
                           const void* send, void* recv, std::size_t count) {
  if (Status s = checkArgs(codec, type, "fp8 all-reduce"); !s) return s;
  if (Status s = checkOp(codec, op, "fp8 all-reduce"); !s) return s;
  int n = 0;
  if (Status s = fromC(weftCommCount(comm, &n), "fp8 all-reduce"); !s) return s;
  // Equal shares of whole blocks' worth where possible; the input padded with zeros to n of them.
  const auto ranks = static_cast<std::size_t>(n);
  const std::size_t share = (count + ranks - 1) / ranks;
  const std::size_t size = sizeOf(type);
  std::vector<std::byte> padded(share * ranks * size, std::byte{0});
  std::memcpy(padded.data(), send, count * size);
  std::vector<float> sums;
  if (Status s = reduceShare(comm, codec, type, op, padded.data(), share, sums); !s) return s;
  // The second stage's one quantization: the reduced share, from its f32 sums.
  std::vector<std::byte> mine(codec.encodedBytes(share));
  if (Status s = encode(codec, DataType::f32, sums.data(), share, mine.data()); !s) return s;
  return gatherEncoded(comm, codec, type, mine, share, count, recv);
}

}  // namespace weft::fused::fp8
