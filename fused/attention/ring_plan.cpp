#include "fused/attention/ring_plan.hpp"

#include <string>

namespace weft::fused::attention {

Result<Zigzag> Zigzag::of(std::size_t length, int nranks) {
  if (nranks < 1) return invalidArgument("zigzag sharding: " + std::to_string(nranks) + " ranks");
  const auto parts = 2 * static_cast<std::size_t>(nranks);
  if (nranks == 1) return Zigzag{length, length / 2, 1};  // the whole sequence, in order
  if (length % parts != 0)
    return invalidArgument("zigzag sharding: a sequence of " + std::to_string(length) +
                           " tokens does not split into 2 x " + std::to_string(nranks) +
                           " equal chunks");
  return Zigzag{length, length / parts, nranks};
}

std::array<std::size_t, 2> Zigzag::starts(int rank) const {
  const auto r = static_cast<std::size_t>(rank), n = static_cast<std::size_t>(nranks);
  return {r * chunk, (2 * n - 1 - r) * chunk};
}

std::size_t Zigzag::position(int rank, std::size_t local) const {
  const auto s = starts(rank);
  return local < chunk ? s[0] + local : s[1] + (local - chunk);
}

Status zigzagLocal(const std::int32_t* cuSeqlens, int sequences, int nranks, int rank,
                   std::int32_t* localCuSeqlens, std::int32_t* positions) {
  if (sequences < 0 || nranks < 1 || rank < 0 || rank >= nranks)
    return invalidArgument("zigzag sharding: " + std::to_string(sequences) + " sequences, rank " +
                           std::to_string(rank) + " of " + std::to_string(nranks));
  if (cuSeqlens[0] != 0) return invalidArgument("zigzag sharding: cu_seqlens[0] must be 0");
  std::int32_t at = 0;
  localCuSeqlens[0] = 0;
  for (int s = 0; s < sequences; ++s) {
    const std::int32_t begin = cuSeqlens[s], end = cuSeqlens[s + 1];
    if (end < begin)
      return invalidArgument("zigzag sharding: cu_seqlens decreases at sequence " +
                             std::to_string(s));
    auto z = Zigzag::of(static_cast<std::size_t>(end - begin), nranks);
    if (!z) return invalidArgument("sequence " + std::to_string(s) + ": " + z.status().message());
    const auto local = static_cast<std::int32_t>(2 * z->chunk);
    if (positions != nullptr) {
      for (std::int32_t i = 0; i < local; ++i)
        positions[at + i] =
            static_cast<std::int32_t>(z->position(rank, static_cast<std::size_t>(i)));
    }
    at += local;
    localCuSeqlens[s + 1] = at;
  }
  return {};
}

Piece ringStep(int rank, int step, int nranks, bool causal) {
  if (!causal) return {Part::all, Part::all, false};
  if (step == 0) return {Part::all, Part::all, true};
  const int source = ((rank - step) % nranks + nranks) % nranks;
  // A lower rank's chunks: its first precedes both of ours, its second follows both.
  if (source < rank) return {Part::all, Part::first, false};
  // A higher rank's: both precede our second chunk and follow our first.
  return {Part::second, Part::all, false};
}

std::size_t pairs(const Piece& p, std::size_t chunk) {
  const std::size_t q = p.q == Part::all ? 2 * chunk : chunk;
  const std::size_t kv = p.kv == Part::all ? 2 * chunk : chunk;
  if (!p.causal) return q * kv;
  return q * (q + 1) / 2;  // a square: queries and keys the same tokens
}

}  // namespace weft::fused::attention
