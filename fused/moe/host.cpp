#include "fused/moe/host.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "fused/fp8/codec.hpp"

namespace weft::fused::moe {
namespace {

// What every rank tells every other before the exchange: its routing's state, its capacity,
// and for each rank q the tokens it sends q and the slots of each of q's experts.
struct Counts {
  std::size_t n, L;
  std::vector<std::uint64_t> all;  // rank s's record at s · width()
  std::size_t width() const { return 2 + n * (1 + L); }
  std::uint64_t& bad(std::size_t s) { return all[s * width()]; }
  std::uint64_t& capacity(std::size_t s) { return all[s * width() + 1]; }
  std::uint64_t& tokens(std::size_t s, std::size_t q) { return all[s * width() + 2 + q * (1 + L)]; }
  std::uint64_t& slots(std::size_t s, std::size_t q, std::size_t e) {
    return all[s * width() + 2 + q * (1 + L) + 1 + e];
  }
};

// A sent token's record: its values, then its source index and, for each slot, the local
// expert on the destination (−1: another rank's, or dropped) and the weight.
// A row as sent: its values, or (fp8 dispatch) their e4m3 elements then their scales.
std::size_t sentRowBytes(const algo::MoeShape& s, const DispatchCall& call) {
  return call.fp8 ? dispatchCodec().encodedBytes(s.hidden) : s.hidden * sizeOf(call.type);
}
std::size_t recordBytes(const algo::MoeShape& s, const DispatchCall& call) {
  const std::size_t bytes = sentRowBytes(s, call) + 4 + 8 * static_cast<std::size_t>(s.topk);
  return (bytes + 7) / 8 * 8;
}

// acc[c] += w · b[c] (bf16 widened exactly), each product and sum rounded to f32 as the
// device's combine rounds them (w = 1: the product is b[c] itself).
void addBf16(float* acc, const std::uint16_t* b, std::size_t count, float w) {
  for (std::size_t c = 0; c < count; ++c) {
    const std::uint32_t bits = static_cast<std::uint32_t>(b[c]) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    acc[c] += w * v;
  }
}

}  // namespace

fp8::Codec dispatchCodec() {
  return fp8::Codec{fp8::Element::e4m3, fp8::ScaleKind::f32, 128};
}

Result<MoeLayout> dispatchHost(Communicator& comm, const algo::MoeShape& shape,
                               const DispatchCall& call) {
  if (Status s = algo::checkMoeShape(shape); !s) return s;
  if (shape.nranks != comm.size())
    return invalidArgument("moe dispatch: a shape of " + std::to_string(shape.nranks) +
                           " ranks on a communicator of " + std::to_string(comm.size()));
  if (call.type != DataType::bf16 && call.type != DataType::f16 && call.type != DataType::f32)
    return invalidArgument("moe dispatch: " + std::string(name(call.type)) +
                           " tokens (bf16, f16 and f32 are dispatched)");
  const auto n = static_cast<std::size_t>(comm.size()), me = static_cast<std::size_t>(comm.rank());
  const auto L = static_cast<std::size_t>(shape.localExperts());
  const auto k = static_cast<std::size_t>(shape.topk);
  const std::size_t es = sizeOf(call.type), rowBytes = shape.hidden * es;
  // This rank's routing; a bad one still takes part in the counts, so that every rank refuses.
  Status mine;
  if (shape.tokens > 0 &&
      (call.x == nullptr || call.topkIdx == nullptr || call.topkWeights == nullptr))
    mine = invalidArgument("moe dispatch: x, topk_idx and topk_weights must not be NULL");
  if (call.capacity > 0 && (call.recvX == nullptr || call.expertCounts == nullptr))
    mine = invalidArgument("moe dispatch: recv_x and expert_counts must not be NULL");
  Result<algo::RankRoute> route = mine ? algo::routeTokens(shape, call.topkIdx) : mine;
  Counts c{n, L, std::vector<std::uint64_t>(n * (2 + n * (1 + L)), 0)};
  c.bad(me) = route ? 0 : 1;
  c.capacity(me) = call.capacity;
  if (route) {
    for (std::size_t q = 0; q < n; ++q) c.tokens(me, q) = route->toRank(static_cast<int>(q));
    for (std::size_t e = 0; e < n * L; ++e) c.slots(me, e / L, e % L) = route->perExpert[e];
  }
  const std::vector<std::uint64_t> own(
      c.all.begin() + static_cast<std::ptrdiff_t>(me * c.width()),
      c.all.begin() + static_cast<std::ptrdiff_t>((me + 1) * c.width()));
  if (Status s = comm.allGather(own.data(), c.all.data(), c.width(), DataType::u64); !s) return s;
  for (std::size_t s = 0; s < n; ++s) {
    if (c.bad(s) == 0) continue;
    if (s == me) return route.status();
    return invalidArgument("moe dispatch: rank " + std::to_string(s) +
                           "'s routing was refused (its own error says why); nothing dispatched");
  }
  for (std::size_t q = 0; q < n; ++q) {
    std::uint64_t rows = 0;
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t e = 0; e < L; ++e) rows += c.slots(s, q, e);
    if (rows > c.capacity(q))
      return Status(Code::invalidArgument, "moe dispatch: rank " + std::to_string(q) +
                                               " receives " + std::to_string(rows) +
                                               " rows but holds " + std::to_string(c.capacity(q)) +
                                               ": " + std::to_string(rows - c.capacity(q)) +
                                               " over its capacity; nothing dispatched");
  }
  MoeLayout layout;
  layout.shape = shape, layout.type = call.type, layout.route = std::move(*route);
  // Each token once per destination: its values and its slots there.
  if (call.fp8 && call.capacity > 0 && call.recvScales == nullptr)
    return invalidArgument("moe dispatch: fp8 dispatch needs recv_scales");
  const std::size_t rec = recordBytes(shape, call);
  const std::size_t sent = sentRowBytes(shape, call);  // a row's bytes in the record
  const auto* x = static_cast<const std::byte*>(call.x);
  std::size_t received = 0;
  for (std::size_t q = 0; q < n; ++q) received += c.tokens(q, me);
  // The communicator's host workspace, reused from call to call: fresh buffers of this size
  // would fault their pages in at every call.
  const std::size_t sendBytes = layout.route.tokens.size() * rec;
  auto ws = comm.workspace(sendBytes + received * rec, false);
  if (!ws) return ws.status();
  std::byte* send = *ws;
  std::byte* recv = *ws + sendBytes;
  for (std::size_t q = 0; q < n; ++q) {
    for (std::size_t i = layout.route.offsets[q]; i < layout.route.offsets[q + 1]; ++i) {
      const auto t = static_cast<std::size_t>(layout.route.tokens[i]);
      std::byte* r = send + i * rec;
      if (call.fp8) {
        if (Status e = fp8::encode(dispatchCodec(), call.type, x + t * rowBytes, shape.hidden, r);
            !e)
          return e;
      } else {
        std::memcpy(r, x + t * rowBytes, rowBytes);
      }
      const auto source = static_cast<std::int32_t>(t);
      std::memcpy(r + sent, &source, 4);
      for (std::size_t j = 0; j < k; ++j) {
        const std::int64_t e = call.topkIdx[t * k + j];
        const bool there =
            e >= 0 && static_cast<std::size_t>(shape.rankOf(static_cast<int>(e))) == q;
        const std::int32_t local =
            there ? static_cast<std::int32_t>(static_cast<std::size_t>(e) % L) : -1;
        std::memcpy(r + sent + 4 + 8 * j, &local, 4);
        std::memcpy(r + sent + 8 + 8 * j, &call.topkWeights[t * k + j], 4);
      }
    }
  }
  std::vector<std::size_t> sendCounts(n), sendDispls(n), recvCounts(n), recvDispls(n);
  layout.fromRank.resize(n);
  std::size_t at = 0;
  for (std::size_t q = 0; q < n; ++q) {
    sendCounts[q] = layout.route.toRank(static_cast<int>(q)) * rec;
    sendDispls[q] = layout.route.offsets[q] * rec;
    layout.fromRank[q] = c.tokens(q, me);
    recvCounts[q] = layout.fromRank[q] * rec;
    recvDispls[q] = at * rec;
    at += layout.fromRank[q];
  }
  if (Status s = comm.allToAllv(send, sendCounts.data(), sendDispls.data(), recv, recvCounts.data(),
                                recvDispls.data(), DataType::u8);
      !s)
    return s;
  // Each local expert's rows: by source rank, then the source's token order.
  std::vector<std::size_t> next(L + 1, 0);
  for (std::size_t e = 0; e < L; ++e) {
    std::uint64_t rows = 0;
    for (std::size_t s = 0; s < n; ++s) rows += c.slots(s, me, e);
    call.expertCounts[e] = static_cast<std::int32_t>(rows);
    next[e + 1] = next[e] + rows;
  }
  layout.rows = next[L];
  auto* out = static_cast<std::byte*>(call.recvX);
  layout.slotOffsets.assign(1, 0);
  std::size_t j = 0;
  for (std::size_t s = 0; s < n; ++s) {
    for (std::size_t i = 0; i < layout.fromRank[s]; ++i, ++j) {
      const std::byte* r = recv + j * rec;
      std::int32_t source;
      std::memcpy(&source, r + sent, 4);
      for (std::size_t slot = 0; slot < k; ++slot) {
        std::int32_t local;
        float weight;
        std::memcpy(&local, r + sent + 4 + 8 * slot, 4);
        std::memcpy(&weight, r + sent + 8 + 8 * slot, 4);
        if (local < 0) continue;
        const std::size_t row = next[static_cast<std::size_t>(local)]++;
        if (call.fp8) {  // the elements to recv_x, the scales to recv_scales
          const std::size_t blocks = dispatchCodec().blocks(shape.hidden);
          std::memcpy(out + row * shape.hidden, r, shape.hidden);
          std::memcpy(call.recvScales + row * blocks, r + shape.hidden, blocks * 4);
        } else {
          std::memcpy(out + row * rowBytes, r, rowBytes);
        }
        if (call.recvSource != nullptr) {
          call.recvSource[2 * row] = static_cast<std::int32_t>(s);
          call.recvSource[2 * row + 1] = source;
        }
        layout.slotRows.push_back(row);
        layout.slotWeights.push_back(weight);
      }
      layout.slotOffsets.push_back(layout.slotRows.size());
    }
  }
  return layout;
}

Status combineHost(Communicator& comm, const MoeLayout& layout, const void* expertOut, void* out) {
  const algo::MoeShape& shape = layout.shape;
  const auto n = static_cast<std::size_t>(comm.size());
  if (shape.nranks != comm.size() || layout.fromRank.size() != n)
    return invalidArgument("moe combine: the layout is another communicator's");
  const std::size_t received = layout.slotOffsets.size() - 1;
  if ((layout.rows > 0 && expertOut == nullptr) || (shape.tokens > 0 && out == nullptr))
    return invalidArgument("moe combine: expert_out and out must not be NULL");
  const DataType t = layout.type;
  const std::size_t es = sizeOf(t), H = shape.hidden, rowBytes = H * es;
  // Each received token's weighted sum over its local experts, in its slots' order, in f32.
  const auto* y = static_cast<const std::byte*>(expertOut);
  // Sent rows, returned rows and the f32 sums in the communicator's reused host workspace.
  const std::size_t sendBytes = received * rowBytes,
                    backBytes = layout.route.tokens.size() * rowBytes;
  const std::size_t sumAt = (sendBytes + backBytes + 63) / 64 * 64;
  auto ws = comm.workspace(sumAt + shape.tokens * H * sizeof(float), false);
  if (!ws) return ws.status();
  std::byte* send = *ws;
  std::byte* back = *ws + sendBytes;
  auto* sum = reinterpret_cast<float*>(*ws + sumAt);
  std::vector<float> acc(H), row(H);
  for (std::size_t j = 0; j < received; ++j) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (std::size_t s = layout.slotOffsets[j]; s < layout.slotOffsets[j + 1]; ++s) {
      const std::byte* from = y + layout.slotRows[s] * rowBytes;
      const float w = layout.slotWeights[s];
      if (t == DataType::bf16) {  // widened in the loop, which then vectorizes
        addBf16(acc.data(), reinterpret_cast<const std::uint16_t*>(from), H, w);
        continue;
      }
      if (Status st = fp8::toFloats(t, from, H, row.data()); !st) return st;
      for (std::size_t c = 0; c < H; ++c) acc[c] += w * row[c];
    }
    if (Status st = fp8::fromFloats(t, acc.data(), H, send + j * rowBytes); !st) return st;
  }
  std::vector<std::size_t> sendCounts(n), sendDispls(n), recvCounts(n), recvDispls(n);
  std::size_t at = 0;
  for (std::size_t q = 0; q < n; ++q) {
    sendCounts[q] = layout.fromRank[q] * rowBytes;
    sendDispls[q] = at * rowBytes;
    at += layout.fromRank[q];
    recvCounts[q] = layout.route.toRank(static_cast<int>(q)) * rowBytes;
    recvDispls[q] = layout.route.offsets[q] * rowBytes;
  }
  if (Status s = comm.allToAllv(send, sendCounts.data(), sendDispls.data(), back, recvCounts.data(),
                                recvDispls.data(), DataType::u8);
      !s)
    return s;
  // Each token's partial sums, in rank order, in f32.
  std::fill(sum, sum + shape.tokens * H, 0.0f);
  for (std::size_t i = 0; i < layout.route.tokens.size(); ++i) {
    const auto tok = static_cast<std::size_t>(layout.route.tokens[i]);
    if (t == DataType::bf16) {
      addBf16(sum + tok * H, reinterpret_cast<const std::uint16_t*>(back + i * rowBytes), H, 1.0f);
      continue;
    }
    if (Status st = fp8::toFloats(t, back + i * rowBytes, H, row.data()); !st) return st;
    for (std::size_t c = 0; c < H; ++c) sum[tok * H + c] += row[c];
  }
  if (Status st = fp8::fromFloats(t, sum, shape.tokens * H, out); !st) return st;
  return {};
}

}  // namespace weft::fused::moe
