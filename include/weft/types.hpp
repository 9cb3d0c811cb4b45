// C++ view of the public types: scoped enums with the C ABI's values, names and parsers.
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "weft/types.h"

namespace weft {

enum class DataType : int {
  f64 = weftFloat64,
  f32 = weftFloat32,
  f16 = weftFloat16,
  bf16 = weftBfloat16,
  f8e4m3 = weftFloat8e4m3,
  f8e5m2 = weftFloat8e5m2,
  i8 = weftInt8,
  u8 = weftUint8,
  i32 = weftInt32,
  u32 = weftUint32,
  i64 = weftInt64,
  u64 = weftUint64,
};
inline constexpr int kNumDataTypes = weftNumDataTypes;

enum class RedOp : int {
  sum = weftSum,
  prod = weftProd,
  min = weftMin,
  max = weftMax,
  avg = weftAvg
};
inline constexpr int kNumRedOps = weftNumRedOps;

enum class Collective : int {
  allReduce = weftCollAllReduce,
  allGather = weftCollAllGather,
  reduceScatter = weftCollReduceScatter,
  broadcast = weftCollBroadcast,
  reduce = weftCollReduce,
  allToAll = weftCollAllToAll,
  allToAllv = weftCollAllToAllv,
  sendRecv = weftCollSendRecv,
};
inline constexpr int kNumCollectives = weftNumCollectives;

inline constexpr std::array<DataType, kNumDataTypes> kAllDataTypes = {
    DataType::f64, DataType::f32, DataType::f16, DataType::bf16, DataType::f8e4m3, DataType::f8e5m2,
    DataType::i8,  DataType::u8,  DataType::i32, DataType::u32,  DataType::i64,    DataType::u64};
inline constexpr std::array<RedOp, kNumRedOps> kAllRedOps = {RedOp::sum, RedOp::prod, RedOp::min,
                                                             RedOp::max, RedOp::avg};
inline constexpr std::array<Collective, kNumCollectives> kAllCollectives = {
    Collective::allReduce, Collective::allGather, Collective::reduceScatter, Collective::broadcast,
    Collective::reduce,    Collective::allToAll,  Collective::allToAllv,     Collective::sendRecv};

// Bytes of one element.
constexpr std::size_t sizeOf(DataType t) {
  switch (t) {
    case DataType::f64:
    case DataType::i64:
    case DataType::u64:
      return 8;
    case DataType::f32:
    case DataType::i32:
    case DataType::u32:
      return 4;
    case DataType::f16:
    case DataType::bf16:
      return 2;
    case DataType::f8e4m3:
    case DataType::f8e5m2:
    case DataType::i8:
    case DataType::u8:
      return 1;
  }
  return 0;
}

constexpr bool isFloating(DataType t) {
  return t == DataType::f64 || t == DataType::f32 || t == DataType::f16 || t == DataType::bf16 ||
         t == DataType::f8e4m3 || t == DataType::f8e5m2;
}

// Whether the collective combines contributions with a reduction op.
constexpr bool isReduction(Collective c) {
  return c == Collective::allReduce || c == Collective::reduceScatter || c == Collective::reduce;
}

// Whether the collective has a root rank.
constexpr bool hasRoot(Collective c) {
  return c == Collective::broadcast || c == Collective::reduce;
}

namespace detail {

inline std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

template <typename E, std::size_t N>
inline std::optional<E> parseByName(std::string_view s, const std::array<E, N>& all) {
  const std::string key = lower(s);
  for (E e : all) {
    if (name(e) == key) return e;
  }
  return std::nullopt;
}

}  // namespace detail

inline std::string_view name(DataType t) {
  switch (t) {
    case DataType::f64:
      return "f64";
    case DataType::f32:
      return "f32";
    case DataType::f16:
      return "f16";
    case DataType::bf16:
      return "bf16";
    case DataType::f8e4m3:
      return "f8e4m3";
    case DataType::f8e5m2:
      return "f8e5m2";
    case DataType::i8:
      return "i8";
    case DataType::u8:
      return "u8";
    case DataType::i32:
      return "i32";
    case DataType::u32:
      return "u32";
    case DataType::i64:
      return "i64";
    case DataType::u64:
      return "u64";
  }
  return "?";
}

inline std::string_view name(RedOp op) {
  switch (op) {
    case RedOp::sum:
      return "sum";
    case RedOp::prod:
      return "prod";
    case RedOp::min:
      return "min";
    case RedOp::max:
      return "max";
    case RedOp::avg:
      return "avg";
  }
  return "?";
}

inline std::string_view name(Collective c) {
  switch (c) {
    case Collective::allReduce:
      return "allreduce";
    case Collective::allGather:
      return "allgather";
    case Collective::reduceScatter:
      return "reducescatter";
    case Collective::broadcast:
      return "broadcast";
    case Collective::reduce:
      return "reduce";
    case Collective::allToAll:
      return "alltoall";
    case Collective::allToAllv:
      return "alltoallv";
    case Collective::sendRecv:
      return "sendrecv";
  }
  return "?";
}

inline std::optional<DataType> parseDataType(std::string_view s) {
  // nccl-tests and PyTorch spellings next to weft's own.
  static const std::pair<std::string_view, DataType> kAliases[] = {
      {"double", DataType::f64},    {"float64", DataType::f64},     {"float", DataType::f32},
      {"float32", DataType::f32},   {"half", DataType::f16},        {"float16", DataType::f16},
      {"bfloat16", DataType::bf16}, {"e4m3", DataType::f8e4m3},     {"fp8_e4m3", DataType::f8e4m3},
      {"e5m2", DataType::f8e5m2},   {"fp8_e5m2", DataType::f8e5m2}, {"int8", DataType::i8},
      {"char", DataType::i8},       {"uint8", DataType::u8},        {"int32", DataType::i32},
      {"int", DataType::i32},       {"uint32", DataType::u32},      {"int64", DataType::i64},
      {"uint64", DataType::u64}};
  if (auto t = detail::parseByName(s, kAllDataTypes)) return t;
  const std::string key = detail::lower(s);
  for (const auto& [alias, t] : kAliases) {
    if (alias == key) return t;
  }
  return std::nullopt;
}

inline std::optional<RedOp> parseRedOp(std::string_view s) {
  return detail::parseByName(s, kAllRedOps);
}

inline std::optional<Collective> parseCollective(std::string_view s) {
  if (auto c = detail::parseByName(s, kAllCollectives)) return c;
  const std::string key = detail::lower(s);
  // nccl-tests binary stems: all_reduce, all_gather, reduce_scatter, alltoall, sendrecv.
  static const std::pair<std::string_view, Collective> kAliases[] = {
      {"all_reduce", Collective::allReduce},         {"all_gather", Collective::allGather},
      {"reduce_scatter", Collective::reduceScatter}, {"all_to_all", Collective::allToAll},
      {"all_to_allv", Collective::allToAllv},        {"send_recv", Collective::sendRecv}};
  for (const auto& [alias, c] : kAliases) {
    if (alias == key) return c;
  }
  return std::nullopt;
}

}  // namespace weft
