#include "src/exec/host_slots.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "src/core/sizes.hpp"
#include "src/exec/host_reduce.hpp"

namespace weft::exec {
namespace {

// All-reduces of at least this many bytes a rank take two shots (and at least 3 ranks).
constexpr std::size_t kTwoShotBytes = 1024;

// The bytes of one rank's input for a call of `count` elements per segment.
std::size_t inputBytes(Collective coll, std::size_t count, DataType type, int nranks) {
  const std::size_t block = count * sizeOf(type);
  return coll == Collective::reduceScatter || coll == Collective::allToAll
             ? block * static_cast<std::size_t>(nranks)
             : block;
}

}  // namespace

bool slotsServe(Collective coll) {
  return coll == Collective::allReduce || coll == Collective::reduce ||
         coll == Collective::reduceScatter || coll == Collective::allGather ||
         coll == Collective::allToAll || coll == Collective::broadcast;
}

Status runSlots(const DirectCall& c, const SlotsGroup& g, std::uint64_t& calls) {
  const auto n = static_cast<std::size_t>(g.nranks), me = static_cast<std::size_t>(g.rank);
  const std::uint64_t k = ++calls;
  const std::size_t s = k % 2;
  // The peers read this slot two calls ago; each has since published the call in between,
  // which it does only after finishing the one before: the slot is this rank's again.
  const std::size_t es = sizeOf(c.type), block = c.count * es;
  const std::size_t inBytes = inputBytes(c.coll, c.count, c.type, g.nranks);
  transport::ShmSmallSlot& mine = g.slots[me][s];
  const bool publishes = c.coll != Collective::broadcast || c.root == g.rank;
  if (publishes && inBytes > 0) std::memcpy(mine.data, c.input, inBytes);
  mine.call.store(k, std::memory_order_release);
  for (std::size_t q = 0; q < n; ++q) {
    if (q == me) continue;
    const auto& call = g.slots[q][s].call;
    if (Status st = g.waiter->wait([&] { return call.load(std::memory_order_acquire) >= k; },
                                   "waiting for a small call's input from", static_cast<int>(q));
        !st)
      return st;
  }
  auto slot = [&](std::size_t q) -> const std::byte* { return g.slots[q][s].data; };
  auto* out = static_cast<std::byte*>(c.output);
  const RedOp op = c.op == RedOp::avg ? RedOp::sum : c.op;
  // Every slot in rank order, so every rank sums alike.
  auto sumAt = [&](std::size_t at) {
    reduce(out, slot(0) + at, slot(1) + at, c.count, c.type, op);
    for (std::size_t q = 2; q < n; ++q) reduce(out, out, slot(q) + at, c.count, c.type, op);
  };
  switch (c.coll) {
    case Collective::allReduce:
      if (block < kTwoShotBytes || block > transport::kShmSmallSlotBytes / 2 || n < 3) {
        sumAt(0);
        break;
      }
      {
        // Two-shot: rank r sums piece r of every slot (in rank order) into the second half of
        // its own slot, then every rank copies the pieces: 2(n - 1)/n of the input read a rank
        // instead of n - 1 inputs.
        const std::size_t v = std::max<std::size_t>(1, 64 / es);
        const std::size_t piece = roundUp(ceilDiv(c.count, n), v);
        auto begin = [&](std::size_t q) { return std::min(c.count, q * piece); };
        std::byte* sum = mine.data + transport::kShmSmallSlotBytes / 2;
        const std::size_t a = begin(me), m = begin(me + 1) - a;
        if (m > 0) {
          reduce(sum, slot(0) + a * es, slot(1) + a * es, m, c.type, op);
          for (std::size_t q = 2; q < n; ++q) reduce(sum, sum, slot(q) + a * es, m, c.type, op);
        }
        mine.reduced.store(k, std::memory_order_release);
        for (std::size_t q = 0; q < n; ++q) {
          if (q == me) continue;
          const auto& reduced = g.slots[q][s].reduced;
          if (Status st = g.waiter->wait(
                  [&] { return reduced.load(std::memory_order_acquire) >= k; },
                  "waiting for a small call's summed piece from", static_cast<int>(q));
              !st)
            return st;
        }
        for (std::size_t q = 0; q < n; ++q) {
          const std::size_t at = begin(q), len = begin(q + 1) - at;
          if (len > 0)
            std::memcpy(out + at * es, slot(q) + transport::kShmSmallSlotBytes / 2, len * es);
        }
      }
      break;
    case Collective::reduce:
      if (g.rank == c.root) sumAt(0);
      break;
    case Collective::reduceScatter:
      sumAt(me * block);
      break;
    case Collective::allGather:
      for (std::size_t q = 0; q < n; ++q) std::memcpy(out + q * block, slot(q), block);
      break;
    case Collective::allToAll:
      for (std::size_t q = 0; q < n; ++q) std::memcpy(out + q * block, slot(q) + me * block, block);
      break;
    case Collective::broadcast:
      std::memcpy(out, slot(static_cast<std::size_t>(c.root)), block);
      break;
    default:
      return internalError("the slots do not serve " + std::string(name(c.coll)));
  }
  return {};
}

}  // namespace weft::exec
