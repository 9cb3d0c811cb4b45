#include "fused/moe/host.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>

#include "fused/fp8/codec.hpp"

namespace weft::fused::moe {
namespace {

// What every rank tells every other before the exchange: its routing's state, its capacity,
// and for each rank q the tokens it sends q and the slots of each of q's experts.
struct Counts {
  std::size_t n, L, hosts;         // hosts: 0 unless the hierarchical path may run
  std::vector<std::uint64_t> all;  // rank s's record at s · width()
  std::size_t width() const { return 2 + n * (1 + L) + hosts; }
  std::uint64_t& toHost(std::size_t s, std::size_t h) {
    return all[s * width() + 2 + n * (1 + L) + h];
  }
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
// device's combine rounds them (w = 1: the product is b[c] itself); compiled for the wider x86
// vector units too, the widest this CPU runs picked at load time (not under ThreadSanitizer,
// as fp8/codec.cpp's).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("default", "avx2", "avx512f")))
#endif
void addBf16(float* acc, const std::uint16_t* b, std::size_t count, float w) {
  for (std::size_t c = 0; c < count; ++c) {
    const std::uint32_t bits = static_cast<std::uint32_t>(b[c]) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    acc[c] += w * v;
  }
}

// A sent token's record at r: its row (encoded in fp8 dispatch), its index, and per slot
// `slot(expert)` (a local expert, an expert, or −1) and the weight.
template <typename Slot>
Status writeRecord(std::byte* r, std::size_t t, const algo::MoeShape& shape,
                   const DispatchCall& call, Slot slot) {
  const std::size_t rowBytes = shape.hidden * sizeOf(call.type), sent = sentRowBytes(shape, call);
  const auto* x = static_cast<const std::byte*>(call.x);
  if (call.fp8) {
    if (Status e = fp8::encode(dispatchCodec(), call.type, x + t * rowBytes, shape.hidden, r); !e)
      return e;
  } else {
    std::memcpy(r, x + t * rowBytes, rowBytes);
  }
  const auto source = static_cast<std::int32_t>(t);
  std::memcpy(r + sent, &source, 4);
  const auto k = static_cast<std::size_t>(shape.topk);
  for (std::size_t j = 0; j < k; ++j) {
    const std::int32_t v = slot(call.topkIdx[t * k + j]);
    std::memcpy(r + sent + 4 + 8 * j, &v, 4);
    std::memcpy(r + sent + 8 + 8 * j, &call.topkWeights[t * k + j], 4);
  }
  return {};
}

// body(begin, end) over [0, count) in contiguous ranges, on as many of the rank's threads as
// have a MiB of `itemBytes` each to move (Communicator::parallel); the first failure, if any.
Status inParallel(Communicator& comm, std::size_t count, std::size_t itemBytes,
                  const std::function<Status(std::size_t, std::size_t)>& body) {
  const std::size_t worth = count * itemBytes >> 20;
  const std::size_t k = std::max<std::size_t>(1, std::min({comm.hostThreads(), worth, count}));
  std::vector<Status> failed(k);
  comm.parallel(k, [&](std::size_t i) { failed[i] = body(count * i / k, count * (i + 1) / k); });
  for (Status& f : failed)
    if (!f) return f;
  return {};
}

// Counts and displacements (in elements of `unit` bytes) from per-rank record counts.
struct Exchange {
  std::vector<std::size_t> counts, displs;
  Exchange(const std::vector<std::size_t>& records, std::size_t unit) {
    counts.resize(records.size()), displs.resize(records.size());
    std::size_t at = 0;
    for (std::size_t q = 0; q < records.size(); ++q) {
      counts[q] = records[q] * unit, displs[q] = at * unit;
      at += records[q];
    }
  }
};

std::size_t total(const std::vector<std::size_t>& v) {
  std::size_t sum = 0;
  for (std::size_t x : v) sum += x;
  return sum;
}

// Counts and displacements of records laid out in an order of our own (put: rank q's records
// at record `at`).
struct Placed {
  std::vector<std::size_t> counts, displs;
  Placed(std::size_t n) : counts(n, 0), displs(n, 0) {}
  void put(std::size_t q, std::size_t records, std::size_t at, std::size_t unit) {
    counts[q] = records * unit, displs[q] = at * unit;
  }
};

// The hierarchical dispatch: this rank's tokens once per host, to the rank of its rail there
// (slots as experts, −1 off that host); as its rail's forwarder on this host, the records it
// got re-addressed to each rank of the host (slots as that rank's local experts), in (source
// rank, token) order. `records`: the received tokens' records, in source order.
Status forwardAlongRails(Communicator& comm, Counts& c, const algo::Rails& rails,
                         const DispatchCall& call, MoeLayout& layout,
                         std::vector<const std::byte*>& records) {
  const algo::MoeShape& shape = layout.shape;
  const std::size_t n = c.n, L = c.L, hosts = c.hosts, me = static_cast<std::size_t>(comm.rank());
  const auto k = static_cast<std::size_t>(shape.topk);
  const std::size_t rec = recordBytes(shape, call), sent = sentRowBytes(shape, call);
  const int myHost = rails.hostOf[me], rail = rails.localOf[me];
  auto hostOfExpert = [&](std::int64_t e) {
    return rails.hostOf[static_cast<std::size_t>(shape.rankOf(static_cast<int>(e)))];
  };
  const algo::HostRoute& toHosts = layout.hostRoute;
  // Records each way, by rank.
  layout.fromRail.assign(n, 0), layout.toLocal.assign(n, 0), layout.fromForwarder.assign(n, 0);
  for (std::size_t s = 0; s < n; ++s) {
    if (rails.localOf[s] == rail)
      layout.fromRail[s] = c.toHost(s, static_cast<std::size_t>(myHost));
    layout.fromForwarder[static_cast<std::size_t>(rails.peer(static_cast<int>(s), myHost))] +=
        c.tokens(s, me);
    for (std::size_t q = 0; q < n; ++q)
      if (rails.localOf[s] == rail && rails.hostOf[q] == myHost)
        layout.toLocal[q] += c.tokens(s, q);
  }
  const std::size_t sent1 = toHosts.tokens.size(), got1 = total(layout.fromRail),
                    sent2 = total(layout.toLocal), got2 = total(layout.fromForwarder);
  auto ws = comm.workspace((sent1 + got1 + sent2 + got2) * rec, false);
  if (!ws) return ws.status();
  std::byte* send1 = *ws;
  std::byte* recv1 = send1 + sent1 * rec;
  std::byte* send2 = recv1 + got1 * rec;
  std::byte* recv2 = send2 + sent2 * rec;
  // Over the network: each token once per host, its slots as experts there.
  Placed out1(n);
  for (std::size_t h = 0; h < hosts; ++h) {
    for (std::size_t i = toHosts.offsets[h]; i < toHosts.offsets[h + 1]; ++i) {
      auto expert = [&](std::int64_t e) -> std::int32_t {
        return e >= 0 && static_cast<std::size_t>(hostOfExpert(e)) == h
                   ? static_cast<std::int32_t>(e)
                   : -1;
      };
      if (Status e = writeRecord(send1 + i * rec, static_cast<std::size_t>(toHosts.tokens[i]),
                                 shape, call, expert);
          !e)
        return e;
    }
    out1.put(static_cast<std::size_t>(rails.peer(static_cast<int>(me), static_cast<int>(h))),
             toHosts.toHost(h), toHosts.offsets[h], rec);
  }
  const Exchange in1(layout.fromRail, rec);
  if (Status s = comm.allToAllv(send1, out1.counts.data(), out1.displs.data(), recv1,
                                in1.counts.data(), in1.displs.data(), DataType::u8);
      !s)
    return s;
  // Within the host: each record to every rank holding one of its experts, in ascending rank
  // order, where the rank's chunk takes it next; combine's parts come back to the same places.
  const Exchange out2(layout.toLocal, rec), in2(layout.fromForwarder, rec);
  std::vector<std::size_t> fill(n);
  for (std::size_t q = 0; q < n; ++q) fill[q] = out2.displs[q] / rec;
  layout.partOffsets.assign(1, 0);
  std::vector<std::size_t> qs;
  for (std::size_t i = 0; i < got1; ++i) {
    const std::byte* r = recv1 + i * rec;
    qs.clear();
    for (std::size_t j = 0; j < k; ++j) {
      std::int32_t e;
      std::memcpy(&e, r + sent + 4 + 8 * j, 4);
      if (e >= 0) qs.push_back(static_cast<std::size_t>(shape.rankOf(e)));
    }
    std::sort(qs.begin(), qs.end());
    qs.erase(std::unique(qs.begin(), qs.end()), qs.end());
    for (std::size_t q : qs) {
      const std::size_t pos = fill[q]++;
      std::byte* r2 = send2 + pos * rec;
      std::memcpy(r2, r, sent + 4);  // the row and the token's index
      for (std::size_t j = 0; j < k; ++j) {
        std::int32_t e;
        std::memcpy(&e, r + sent + 4 + 8 * j, 4);
        const std::int32_t local = e >= 0 && static_cast<std::size_t>(shape.rankOf(e)) == q
                                       ? static_cast<std::int32_t>(static_cast<std::size_t>(e) % L)
                                       : -1;
        std::memcpy(r2 + sent + 4 + 8 * j, &local, 4);
        std::memcpy(r2 + sent + 8 + 8 * j, r + sent + 8 + 8 * j, 4);
      }
      layout.partAt.push_back(pos);
    }
    layout.partOffsets.push_back(layout.partAt.size());
  }
  if (Status s = comm.allToAllv(send2, out2.counts.data(), out2.displs.data(), recv2,
                                in2.counts.data(), in2.displs.data(), DataType::u8);
      !s)
    return s;
  // In source order: each source's tokens come from the forwarder of its rail, in order.
  std::vector<std::size_t> cursor(n);
  for (std::size_t f = 0; f < n; ++f) cursor[f] = in2.displs[f] / rec;
  layout.atForwarded.clear();
  for (std::size_t s = 0; s < n; ++s) {
    const auto f = static_cast<std::size_t>(rails.peer(static_cast<int>(s), myHost));
    for (std::size_t i = 0; i < c.tokens(s, me); ++i) {
      layout.atForwarded.push_back(cursor[f]);
      records[layout.atForwarded.size() - 1] = recv2 + cursor[f]++ * rec;
    }
  }
  return {};
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
  const std::size_t rowBytes = shape.hidden * sizeOf(call.type);
  // This rank's routing; a bad one still takes part in the counts, so that every rank refuses.
  Status mine;
  if (shape.tokens > 0 &&
      (call.x == nullptr || call.topkIdx == nullptr || call.topkWeights == nullptr))
    mine = invalidArgument("moe dispatch: x, topk_idx and topk_weights must not be NULL");
  if (call.capacity > 0 && (call.recvX == nullptr || call.expertCounts == nullptr))
    mine = invalidArgument("moe dispatch: recv_x and expert_counts must not be NULL");
  Result<algo::RankRoute> route = mine ? algo::routeTokens(shape, call.topkIdx) : mine;
  // Across hosts with as many ranks on each, the counts carry the tokens to each host too.
  const std::optional<algo::Rails> rails = algo::Rails::of(comm.hostOf());
  const std::size_t hosts = rails ? static_cast<std::size_t>(rails->hosts) : 0;
  algo::HostRoute hostRoute;  // this rank's tokens to each host, where the ranks span hosts
  Counts c{n, L, hosts, {}};
  c.all.assign(n * c.width(), 0);
  c.bad(me) = route ? 0 : 1;
  c.capacity(me) = call.capacity;
  if (route) {
    for (std::size_t q = 0; q < n; ++q) c.tokens(me, q) = route->toRank(static_cast<int>(q));
    for (std::size_t e = 0; e < n * L; ++e) c.slots(me, e / L, e % L) = route->perExpert[e];
    if (rails) {
      hostRoute = algo::routeToHosts(shape, call.topkIdx, *rails);
      for (std::size_t h = 0; h < hosts; ++h) c.toHost(me, h) = hostRoute.toHost(h);
    }
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
  if (call.fp8 && call.capacity > 0 && call.recvScales == nullptr)
    return invalidArgument("moe dispatch: fp8 dispatch needs recv_scales");
  // Across hosts, the path the selector prices cheaper from every rank's counts (the same on
  // every rank).
  if (rails) {
    algo::MoeTraffic traffic;
    traffic.nranks = static_cast<int>(n);
    traffic.tokens.resize(n * n);
    traffic.toHost.resize(n * hosts);
    for (std::size_t s = 0; s < n; ++s) {
      for (std::size_t q = 0; q < n; ++q) traffic.tokens[s * n + q] = c.tokens(s, q);
      for (std::size_t h = 0; h < hosts; ++h) traffic.toHost[s * hosts + h] = c.toHost(s, h);
    }
    traffic.rails = rails;
    auto plan = comm.moePlanFor(shape, traffic);
    if (!plan) return plan.status();
    layout.hierarchical = plan->hierarchical;
    if (layout.hierarchical) layout.hostRoute = std::move(hostRoute);
  }
  layout.fromRank.resize(n);
  for (std::size_t q = 0; q < n; ++q) layout.fromRank[q] = c.tokens(q, me);
  const std::size_t rec = recordBytes(shape, call);
  const std::size_t sent = sentRowBytes(shape, call);  // a row's bytes in the record
  const std::size_t received = total(layout.fromRank);
  std::vector<const std::byte*> records(received);  // each received token's, in source order
  std::vector<const std::byte*> peers;              // flat, on one host: every rank's workspace
  if (!layout.hierarchical) {
    // Each token once per destination: its values and its slots there.
    // The communicator's host workspace, reused from call to call: fresh buffers of this size
    // would fault their pages in at every call.
    const std::size_t sendBytes = layout.route.tokens.size() * rec,
                      wsBytes = sendBytes + received * rec;
    auto ws = comm.workspace(wsBytes, false);
    if (!ws) return ws.status();
    std::byte* send = *ws;
    std::byte* recv = *ws + sendBytes;
    const std::vector<std::size_t>& offsets = layout.route.offsets;
    if (Status failed = inParallel(
            comm, layout.route.tokens.size(), rec,
            [&](std::size_t begin, std::size_t end) -> Status {
              // Destination q's records are offsets[q] .. offsets[q + 1].
              auto q = static_cast<std::size_t>(
                  std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1);
              for (std::size_t i = begin; i < end; ++i) {
                while (i >= offsets[q + 1]) ++q;
                auto local = [&](std::int64_t e) -> std::int32_t {
                  const bool there =
                      e >= 0 && static_cast<std::size_t>(shape.rankOf(static_cast<int>(e))) == q;
                  return there ? static_cast<std::int32_t>(static_cast<std::size_t>(e) % L) : -1;
                };
                const auto t = static_cast<std::size_t>(layout.route.tokens[i]);
                if (Status e = writeRecord(send + i * rec, t, shape, call, local); !e) return e;
              }
              return {};
            });
        !failed)
      return failed;
    // Where the ranks share a host, each reads its records straight from their senders'
    // workspaces (rank s's for q after those for the ranks before q), else they cross by an
    // all-to-all-v. The same way on every rank.
    auto views = comm.peerWorkspaces(wsBytes);
    if (!views) return views.status();
    peers = std::move(*views);
    layout.atPeer.assign(n, 0);
    for (std::size_t q = 0; q < n; ++q)
      for (std::size_t s = 0; s < me; ++s) layout.atPeer[q] += c.tokens(s, q);
    if (!peers.empty()) {
      std::size_t j = 0;
      for (std::size_t s = 0; s < n; ++s) {
        std::size_t at = 0;  // rank s's records for the ranks before this one
        for (std::size_t q = 0; q < me; ++q) at += c.tokens(s, q);
        for (std::size_t i = 0; i < layout.fromRank[s]; ++i)
          records[j++] = peers[s] + (at + i) * rec;
      }
    } else {
      std::vector<std::size_t> toRank(n);
      for (std::size_t q = 0; q < n; ++q) toRank[q] = layout.route.toRank(static_cast<int>(q));
      const Exchange out(toRank, rec), in(layout.fromRank, rec);
      if (Status s = comm.allToAllv(send, out.counts.data(), out.displs.data(), recv,
                                    in.counts.data(), in.displs.data(), DataType::u8);
          !s)
        return s;
      for (std::size_t j = 0; j < received; ++j) records[j] = recv + j * rec;
    }
  } else if (Status s = forwardAlongRails(comm, c, *rails, call, layout, records); !s) {
    return s;
  }
  // Each local expert's rows: by source rank, then the source's token order.
  std::vector<std::size_t> next(L + 1, 0);
  for (std::size_t e = 0; e < L; ++e) {
    std::uint64_t rows = 0;
    for (std::size_t s = 0; s < n; ++s) rows += c.slots(s, me, e);
    call.expertCounts[e] = static_cast<std::int32_t>(rows);
    next[e + 1] = next[e] + rows;
  }
  layout.rows = next[L];
  // Each slot's row, in order; then the rows copied, on the rank's threads.
  layout.slotOffsets.assign(1, 0);
  std::size_t j = 0;
  for (std::size_t s = 0; s < n; ++s) {
    for (std::size_t i = 0; i < layout.fromRank[s]; ++i, ++j) {
      const std::byte* r = records[j];
      std::int32_t source;
      std::memcpy(&source, r + sent, 4);
      for (std::size_t slot = 0; slot < k; ++slot) {
        std::int32_t local;
        float weight;
        std::memcpy(&local, r + sent + 4 + 8 * slot, 4);
        std::memcpy(&weight, r + sent + 8 + 8 * slot, 4);
        if (local < 0) continue;
        const std::size_t row = next[static_cast<std::size_t>(local)]++;
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
  auto* out = static_cast<std::byte*>(call.recvX);
  const std::size_t blocks = call.fp8 ? dispatchCodec().blocks(shape.hidden) : 0;
  (void)inParallel(comm, received, rowBytes * k, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      for (std::size_t slot = layout.slotOffsets[i]; slot < layout.slotOffsets[i + 1]; ++slot) {
        const std::size_t row = layout.slotRows[slot];
        if (call.fp8) {  // the elements to recv_x, the scales to recv_scales
          std::memcpy(out + row * shape.hidden, records[i], shape.hidden);
          std::memcpy(call.recvScales + row * blocks, records[i] + shape.hidden, blocks * 4);
        } else {
          std::memcpy(out + row * rowBytes, records[i], rowBytes);
        }
      }
    }
    return Status{};
  });
  // Nobody writes its workspace again while a peer may still read it.
  if (!peers.empty()) {
    if (Status s = comm.doneWithPeerWorkspaces(peers); !s) return s;
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
  const auto* y = static_cast<const std::byte*>(expertOut);
  // The rows each way and the f32 sums, in the communicator's reused host workspace. Flat:
  // the received tokens' parts out, this rank's tokens' back. Hierarchical: the parts to the
  // forwarders, the parts a forwarder gets, its sums for its rail, and this rank's tokens' back
  // from each host.
  // Flat on one host, the peers read the parts straight from this rank's workspace
  // (layout.atPeer), and nothing comes back through it.
  const bool rails = layout.hierarchical;
  const std::size_t sendRows = received, gotRows = rails ? total(layout.toLocal) : 0,
                    sumsRows = rails ? total(layout.fromRail) : 0,
                    backRows = rails ? layout.hostRoute.tokens.size() : layout.route.tokens.size();
  const std::size_t rows = sendRows + gotRows + sumsRows + backRows;
  const std::size_t sumAt = (rows * rowBytes + 63) / 64 * 64;
  const std::size_t wsBytes = sumAt + shape.tokens * H * sizeof(float);
  auto ws = comm.workspace(wsBytes, false);
  if (!ws) return ws.status();
  std::byte* send = *ws;
  std::byte* got = send + sendRows * rowBytes;
  std::byte* sums = got + gotRows * rowBytes;
  std::byte* back = sums + sumsRows * rowBytes;
  auto* sum = reinterpret_cast<float*>(*ws + sumAt);
  // acc (f32) += row of type t at `from`, times w (`row`: a thread's scratch of H floats).
  auto add = [&](float* acc, const std::byte* from, float w, std::vector<float>& row) -> Status {
    if (t == DataType::bf16) {  // widened in the loop, which then vectorizes
      addBf16(acc, reinterpret_cast<const std::uint16_t*>(from), H, w);
      return {};
    }
    row.resize(H);
    if (Status st = fp8::toFloats(t, from, H, row.data()); !st) return st;
    if (w == 1.0f) {
      for (std::size_t c = 0; c < H; ++c) acc[c] += row[c];
    } else {
      for (std::size_t c = 0; c < H; ++c) acc[c] += w * row[c];
    }
    return {};
  };
  // Each received token's weighted sum over its local experts, in its slots' order, in f32,
  // rounded once to the type; on the rank's threads.
  const std::size_t perToken = rowBytes * (1 + static_cast<std::size_t>(shape.topk));
  if (Status st = inParallel(
          comm, received, perToken,
          [&](std::size_t begin, std::size_t end) {
            std::vector<float> acc(H), row;
            for (std::size_t j = begin; j < end; ++j) {
              std::fill(acc.begin(), acc.end(), 0.0f);
              for (std::size_t s = layout.slotOffsets[j]; s < layout.slotOffsets[j + 1]; ++s)
                if (Status e = add(acc.data(), y + layout.slotRows[s] * rowBytes,
                                   layout.slotWeights[s], row);
                    !e)
                  return e;
              const std::size_t at = rails ? layout.atForwarded[j] : j;
              if (Status e = fp8::fromFloats(t, acc.data(), H, send + at * rowBytes); !e) return e;
            }
            return Status{};
          });
      !st)
    return st;
  std::vector<const std::byte*> peers;  // flat: every rank's workspace, or empty
  if (!rails) {
    auto views = comm.peerWorkspaces(wsBytes);
    if (!views) return views.status();
    peers = std::move(*views);
  }
  // Each token's parts (ranks', or hosts'), in rank or host order, in f32, rounded once into
  // out; each of the rank's threads sums a range of the tokens. parts[i]: tokens[i]'s.
  auto sumParts = [&](const std::vector<std::int32_t>& tokens,
                      const std::vector<const std::byte*>& parts) -> Status {
    const std::size_t each = tokens.size() * rowBytes / std::max<std::size_t>(1, shape.tokens);
    return inParallel(comm, shape.tokens, each, [&](std::size_t begin, std::size_t end) {
      std::fill(sum + begin * H, sum + end * H, 0.0f);
      std::vector<float> row;
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        const auto tok = static_cast<std::size_t>(tokens[i]);
        if (tok < begin || tok >= end) continue;
        if (Status e = add(sum + tok * H, parts[i], 1.0f, row); !e) return e;
      }
      return fp8::fromFloats(t, sum + begin * H, (end - begin) * H,
                             static_cast<std::byte*>(out) + begin * rowBytes);
    });
  };
  const std::vector<std::int32_t>& tokens = rails ? layout.hostRoute.tokens : layout.route.tokens;
  std::vector<const std::byte*> parts(tokens.size());
  if (!rails && !peers.empty()) {
    // Rank q's parts for this rank's tokens, straight from its workspace.
    for (std::size_t q = 0; q < n; ++q)
      for (std::size_t i = layout.route.offsets[q]; i < layout.route.offsets[q + 1]; ++i)
        parts[i] = peers[q] + (layout.atPeer[q] + i - layout.route.offsets[q]) * rowBytes;
    const Status st = sumParts(tokens, parts);
    // Nobody writes its workspace again while a peer may still read it.
    if (Status s = comm.doneWithPeerWorkspaces(peers); !s) return s;
    return st;
  }
  if (!rails) {
    std::vector<std::size_t> toRank(n);
    for (std::size_t q = 0; q < n; ++q) toRank[q] = layout.route.toRank(static_cast<int>(q));
    const Exchange outgoing(layout.fromRank, rowBytes);
    Placed incoming(n);
    for (std::size_t q = 0; q < n; ++q)
      incoming.put(q, toRank[q], layout.route.offsets[q], rowBytes);
    if (Status s = comm.allToAllv(send, outgoing.counts.data(), outgoing.displs.data(), back,
                                  incoming.counts.data(), incoming.displs.data(), DataType::u8);
        !s)
      return s;
  } else {
    // To the forwarders; each sums a record's parts in rank order (f32, rounded once) and sends
    // the sums back along its rail.
    const Exchange toForwarders(layout.fromForwarder, rowBytes),
        atForwarder(layout.toLocal, rowBytes);
    if (Status s =
            comm.allToAllv(send, toForwarders.counts.data(), toForwarders.displs.data(), got,
                           atForwarder.counts.data(), atForwarder.displs.data(), DataType::u8);
        !s)
      return s;
    std::vector<float> acc(H), row;
    for (std::size_t i = 0; i + 1 < layout.partOffsets.size(); ++i) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (std::size_t p = layout.partOffsets[i]; p < layout.partOffsets[i + 1]; ++p)
        if (Status st = add(acc.data(), got + layout.partAt[p] * rowBytes, 1.0f, row); !st)
          return st;
      if (Status st = fp8::fromFloats(t, acc.data(), H, sums + i * rowBytes); !st) return st;
    }
    const Exchange alongRail(layout.fromRail, rowBytes);
    // Host h's sums come from the rank of this rank's rail there.
    const std::optional<algo::Rails> hostRails = algo::Rails::of(comm.hostOf());
    if (!hostRails) return invalidArgument("moe combine: the layout is another communicator's");
    const auto me = comm.rank();
    Placed fromHosts(n);
    const algo::HostRoute& toHosts = layout.hostRoute;
    for (std::size_t h = 0; h + 1 < toHosts.offsets.size(); ++h)
      fromHosts.put(static_cast<std::size_t>(hostRails->peer(me, static_cast<int>(h))),
                    toHosts.toHost(h), toHosts.offsets[h], rowBytes);
    if (Status s = comm.allToAllv(sums, alongRail.counts.data(), alongRail.displs.data(), back,
                                  fromHosts.counts.data(), fromHosts.displs.data(), DataType::u8);
        !s)
      return s;
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) parts[i] = back + i * rowBytes;
  return sumParts(tokens, parts);
}

}  // namespace weft::fused::moe
