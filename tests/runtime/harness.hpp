// Shared by the runtime tests: typed element access for every DataType, fresh random inputs, a
// double-precision reference, poisoned outputs, and running one function per rank on threads.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "src/exec/numeric.hpp"
#include "weft/types.hpp"
#include "weft/weft.hpp"

namespace weft::test {

// Element i of a buffer of `type`, as a double.
inline double load(const std::vector<std::byte>& buf, std::size_t i, DataType type) {
  const std::byte* p = buf.data() + i * sizeOf(type);
  auto as = [&](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (type) {
    case DataType::f64:
      return as(double{});
    case DataType::f32:
      return as(float{});
    case DataType::f16:
      return exec::halfToFloat(as(std::uint16_t{}));
    case DataType::bf16:
      return exec::bf16ToFloat(as(std::uint16_t{}));
    case DataType::f8e4m3:
      return exec::e4m3ToFloat(as(std::uint8_t{}));
    case DataType::f8e5m2:
      return exec::e5m2ToFloat(as(std::uint8_t{}));
    case DataType::i8:
      return as(std::int8_t{});
    case DataType::u8:
      return as(std::uint8_t{});
    case DataType::i32:
      return as(std::int32_t{});
    case DataType::u32:
      return as(std::uint32_t{});
    case DataType::i64:
      return static_cast<double>(as(std::int64_t{}));
    case DataType::u64:
      return static_cast<double>(as(std::uint64_t{}));
  }
  return 0;
}

// Stores v (already representable, or rounded) as element i.
inline void store(std::vector<std::byte>& buf, std::size_t i, DataType type, double v) {
  std::byte* p = buf.data() + i * sizeOf(type);
  auto put = [&](auto x) { std::memcpy(p, &x, sizeof x); };
  switch (type) {
    case DataType::f64:
      put(v);
      break;
    case DataType::f32:
      put(static_cast<float>(v));
      break;
    case DataType::f16:
      put(exec::floatToHalf(static_cast<float>(v)));
      break;
    case DataType::bf16:
      put(exec::floatToBf16(static_cast<float>(v)));
      break;
    case DataType::f8e4m3:
      put(exec::floatToE4m3(static_cast<float>(v)));
      break;
    case DataType::f8e5m2:
      put(exec::floatToE5m2(static_cast<float>(v)));
      break;
    case DataType::i8:
      put(static_cast<std::int8_t>(v));
      break;
    case DataType::u8:
      put(static_cast<std::uint8_t>(v));
      break;
    case DataType::i32:
      put(static_cast<std::int32_t>(v));
      break;
    case DataType::u32:
      put(static_cast<std::uint32_t>(v));
      break;
    case DataType::i64:
      put(static_cast<std::int64_t>(v));
      break;
    case DataType::u64:
      put(static_cast<std::uint64_t>(v));
      break;
  }
}

// Random inputs every type holds exactly, in ranges where sums and products of a few ranks stay
// meaningful: floats in [-1, 1] ([0.5, 1.5] for products), integers small.
inline std::vector<std::byte> randomBuffer(std::size_t count, DataType type, RedOp op,
                                           std::mt19937_64& rng) {
  std::vector<std::byte> buf(count * sizeOf(type));
  std::uniform_real_distribution<double> real(op == RedOp::prod ? 0.5 : -1.0,
                                              op == RedOp::prod ? 1.5 : 1.0);
  std::uniform_int_distribution<int> small(0, 60);
  const bool isSigned = type == DataType::i8 || type == DataType::i32 || type == DataType::i64;
  for (std::size_t i = 0; i < count; ++i) {
    if (isFloating(type)) {
      store(buf, i, type, real(rng));
    } else {
      const int v = op == RedOp::prod ? 1 + small(rng) % 3 : small(rng) - (isSigned ? 30 : 0);
      store(buf, i, type, v);
    }
  }
  return buf;
}

// The poison every output starts as: 0xA5 bytes (a NaN-free, recognisable pattern).
inline std::vector<std::byte> poisoned(std::size_t bytes) {
  return std::vector<std::byte>(bytes, std::byte{0xA5});
}

// How a floating type rounds (both 0 for integers: exact): the unit roundoff of one step, and
// the gap between zero and the smallest subnormal (rounding near zero is absolute, not relative).
struct Rounding {
  double unit = 0;
  double smallest = 0;
};

inline Rounding roundingOf(DataType t) {
  switch (t) {
    case DataType::f64:
      return {0x1p-52, 0x1p-1074};
    case DataType::f32:
      return {0x1p-23, 0x1p-149};
    case DataType::f16:
      return {0x1p-10, 0x1p-24};
    case DataType::bf16:
      return {0x1p-7, 0x1p-133};
    case DataType::f8e4m3:
      return {0x1p-3, 0x1p-9};
    case DataType::f8e5m2:
      return {0x1p-2, 0x1p-16};
    default:
      return {};
  }
}

// Integers wrap in their type: the reference is computed in the type's own arithmetic.
inline double wrap(double v, DataType t) {
  switch (t) {
    case DataType::i8:
      return static_cast<std::int8_t>(static_cast<std::int64_t>(v));
    case DataType::u8:
      return static_cast<std::uint8_t>(static_cast<std::int64_t>(v));
    case DataType::i32:
      return static_cast<std::int32_t>(static_cast<std::int64_t>(v));
    case DataType::u32:
      return static_cast<std::uint32_t>(static_cast<std::int64_t>(v));
    default:
      return v;
  }
}

// The reduction of `values` (one per rank, in rank order) and the error it may carry: each of
// the n-1 combining steps rounds once, and avg rounds once more.
struct Expected {
  double value;
  double tolerance;
};

inline Expected reference(const std::vector<double>& values, DataType t, RedOp op) {
  const double n = static_cast<double>(values.size());
  double v = values[0], scale = std::fabs(values[0]);
  for (std::size_t i = 1; i < values.size(); ++i) {
    const double x = values[i];
    switch (op) {
      case RedOp::sum:
      case RedOp::avg:
        v = wrap(v + x, t);
        scale += std::fabs(x);
        break;
      case RedOp::prod:
        v = wrap(v * x, t);
        scale = std::fabs(v);
        break;
      case RedOp::min:
        v = std::min(v, x);
        break;
      case RedOp::max:
        v = std::max(v, x);
        break;
    }
  }
  if (op == RedOp::avg) {
    if (isFloating(t)) {
      v /= n;
      scale /= n;
    } else {
      v = std::trunc(v / n);
    }
  }
  const Rounding r = roundingOf(t);
  const double steps = n + (op == RedOp::avg ? 1 : 0);
  return {v, steps * (2 * r.unit * std::max(scale, std::fabs(v)) + r.smallest)};
}

// Runs fn(rank) on one thread per rank and waits for all.
inline void onEveryRank(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

// n communicators of one process, one per rank; none (and a test failure) if they cannot start.
inline std::vector<Comm> makeComms(int n) {
  auto comms = Comm::initAll(n);
  EXPECT_TRUE(comms.isOk()) << comms.status().toString();
  return comms.isOk() ? std::move(*comms) : std::vector<Comm>{};
}

// One collective call of the matrix.
struct Case {
  Collective coll;
  DataType type;
  RedOp op;
  std::size_t count;
  bool inPlace;
  int root;
  // All-reduce only: every rank's output must be the same bits (a fixed summation order).
  bool sameBits = false;
};

inline std::string describe(const Case& c, int n) {
  return std::string(name(c.coll)) + " " + std::string(name(c.type)) + " " +
         std::string(name(c.op)) + " count=" + std::to_string(c.count) +
         (c.inPlace ? " in-place" : " out-of-place") + " root=" + std::to_string(c.root) +
         " ranks=" + std::to_string(n);
}

// Input and output element counts of one rank.
inline std::pair<std::size_t, std::size_t> sizes(Collective coll, std::size_t count, int n) {
  const auto N = static_cast<std::size_t>(n);
  switch (coll) {
    case Collective::allGather:
      return {count, N * count};
    case Collective::reduceScatter:
      return {N * count, count};
    case Collective::allToAll:
      return {N * count, N * count};
    default:
      return {count, count};
  }
}

// Rank r's input of case c run with `seed`: a function of (seed, rank) alone, so a rank of a
// multi-process run computes its peers' inputs by itself.
inline std::vector<std::byte> caseInput(const Case& c, std::uint64_t seed, int r, int n) {
  std::mt19937_64 rng(seed * 1315423911u + static_cast<std::uint64_t>(r));
  return randomBuffer(sizes(c.coll, c.count, n).first, c.type, c.op, rng);
}

// Checks rank r's result of case c (`got`: its output, or for an in-place reduce-scatter its
// piece of the input) against the double-precision reference over every rank's `original`
// input; "" or what is wrong. A non-root's output of reduce must still hold the poison.
inline std::string checkRank(const Case& c, int n, int r,
                             const std::vector<std::vector<std::byte>>& original,
                             const std::vector<std::byte>& got) {
  const auto R = static_cast<std::size_t>(r);
  const std::size_t es = sizeOf(c.type);
  const std::size_t outCount = sizes(c.coll, c.count, n).second;
  if (c.coll == Collective::reduce && r != c.root) {
    if (got != poisoned(outCount * es) && !c.inPlace)
      return "rank " + std::to_string(r) + " is not the root, yet its output changed";
    return "";
  }
  for (std::size_t i = 0; i < outCount; ++i) {
    Expected e{};
    std::vector<double> values;
    switch (c.coll) {
      case Collective::allReduce:
      case Collective::reduce:
        for (int q = 0; q < n; ++q)
          values.push_back(load(original[static_cast<std::size_t>(q)], i, c.type));
        e = reference(values, c.type, c.op);
        break;
      case Collective::reduceScatter:
        for (int q = 0; q < n; ++q)
          values.push_back(load(original[static_cast<std::size_t>(q)], R * c.count + i, c.type));
        e = reference(values, c.type, c.op);
        break;
      case Collective::allGather:
        e = {load(original[i / c.count], i % c.count, c.type), 0};
        break;
      case Collective::broadcast:
        e = {load(original[static_cast<std::size_t>(c.root)], i, c.type), 0};
        break;
      case Collective::allToAll:  // block j of rank r comes from rank j's block r
        e = {load(original[i / c.count], R * c.count + i % c.count, c.type), 0};
        break;
      default:
        break;
    }
    const double v = load(got, i, c.type);
    if (!(std::fabs(v - e.value) <= e.tolerance)) {
      return "rank " + std::to_string(r) + " element " + std::to_string(i) + ": got " +
             std::to_string(v) + ", expected " + std::to_string(e.value) + " +- " +
             std::to_string(e.tolerance);
    }
  }
  return "";
}

// Where the buffers of a GPU run live: the test supplies device allocation, copies, each rank's
// stream, and the wait for a rank's call (which returns its asynchronous error, or "").
struct DeviceMemory {
  std::function<std::byte*(int rank, std::size_t bytes)> alloc;
  std::function<void(int rank, std::byte*)> release;
  std::function<void(int rank, void* to, const void* from, std::size_t bytes)> copy;
  std::function<void*(int rank)> stream;
  std::function<std::string(Comm& comm, int rank)> finish;
  // Run first on each rank's thread (its GPU made current); may be empty.
  std::function<void(int rank)> enter;
};

// Runs one case on the ranks this process holds and checks every output element of theirs;
// returns "" or the first failure. Every rank's input is a function of (seed, rank), so a rank
// of a multi-process run computes its peers' inputs, and its expected output, by itself.
// comms: all n ranks (threads), or just this process's rank `only` of n. With `gpu`, the
// buffers are copied to device memory (poison included) and the results copied back.
inline std::string runCase(std::vector<Comm>& comms, const Case& c, std::uint64_t seed, int n = -1,
                           int only = -1, const DeviceMemory* gpu = nullptr) {
  if (n < 0) n = static_cast<int>(comms.size());
  auto mine = [&](int r) { return only < 0 || r == only; };
  auto commOf = [&](int r) -> Comm& { return comms[only < 0 ? static_cast<std::size_t>(r) : 0]; };
  const std::size_t es = sizeOf(c.type);
  const std::size_t outCount = sizes(c.coll, c.count, n).second;
  std::vector<std::vector<std::byte>> in(static_cast<std::size_t>(n)), out(in.size());
  for (int r = 0; r < n; ++r) {
    in[static_cast<std::size_t>(r)] = caseInput(c, seed, r, n);
    out[static_cast<std::size_t>(r)] = poisoned(outCount * es);
  }
  const std::vector<std::vector<std::byte>> original = in;
  // In place: the input lives inside the output, where the collective says.
  std::vector<std::byte*> sendPtr(static_cast<std::size_t>(n)), recvPtr(sendPtr.size());
  for (int r = 0; r < n; ++r) {
    auto& I = in[static_cast<std::size_t>(r)];
    auto& O = out[static_cast<std::size_t>(r)];
    sendPtr[static_cast<std::size_t>(r)] = I.data();
    recvPtr[static_cast<std::size_t>(r)] = O.data();
    if (!c.inPlace) continue;
    const std::size_t rc = static_cast<std::size_t>(r) * c.count * es;
    switch (c.coll) {
      case Collective::allGather:
        if (c.count > 0) std::memcpy(O.data() + rc, I.data(), c.count * es);
        sendPtr[static_cast<std::size_t>(r)] = O.data() + rc;
        break;
      case Collective::reduceScatter:
        recvPtr[static_cast<std::size_t>(r)] = I.data() + rc;
        break;
      case Collective::reduce:
        if (r != c.root) break;
        [[fallthrough]];
      default:
        O = I;
        sendPtr[static_cast<std::size_t>(r)] = O.data();
        break;
    }
  }
  std::vector<Status> st(static_cast<std::size_t>(n));
  // GPU: each rank's input and output in device memory, the pointers moved there.
  std::vector<std::byte*> devIn(static_cast<std::size_t>(n)), devOut(devIn.size());
  std::vector<std::string> async(static_cast<std::size_t>(n));
  auto toDevice = [&](int r, const std::byte* p) -> std::byte* {
    const auto R = static_cast<std::size_t>(r);
    const std::byte* I = in[R].data();
    const std::byte* O = out[R].data();
    if (p >= I && p <= I + in[R].size()) return devIn[R] + (p - I);
    return devOut[R] + (p - O);
  };
  auto body = [&](int r) {
    Comm& comm = commOf(r);
    const auto R = static_cast<std::size_t>(r);
    const void* s = sendPtr[R];
    void* d = recvPtr[R];
    void* stream = nullptr;
    if (gpu != nullptr) {
      if (gpu->enter) gpu->enter(r);
      devIn[R] = gpu->alloc(r, std::max<std::size_t>(in[R].size(), 16));
      devOut[R] = gpu->alloc(r, std::max<std::size_t>(out[R].size(), 16));
      gpu->copy(r, devIn[R], in[R].data(), in[R].size());
      gpu->copy(r, devOut[R], out[R].data(), out[R].size());
      s = toDevice(r, sendPtr[R]);
      d = toDevice(r, recvPtr[R]);
      stream = gpu->stream(r);
    }
    Status& x = st[R];
    switch (c.coll) {
      case Collective::allReduce:
        x = comm.allReduce(s, d, c.count, c.type, c.op, stream);
        break;
      case Collective::allGather:
        x = comm.allGather(s, d, c.count, c.type, stream);
        break;
      case Collective::reduceScatter:
        x = comm.reduceScatter(s, d, c.count, c.type, c.op, stream);
        break;
      case Collective::broadcast:
        x = comm.broadcast(s, d, c.count, c.type, c.root, stream);
        break;
      case Collective::reduce:
        x = comm.reduce(s, d, c.count, c.type, c.op, c.root, stream);
        break;
      case Collective::allToAll:
        x = comm.allToAll(s, d, c.count, c.type, stream);
        break;
      default:
        x = Status(Code::internalError, "not a collective of this test");
        break;
    }
    if (gpu != nullptr) {
      async[R] = gpu->finish(comm, r);
      gpu->copy(r, in[R].data(), devIn[R], in[R].size());
      gpu->copy(r, out[R].data(), devOut[R], out[R].size());
      gpu->release(r, devIn[R]);
      gpu->release(r, devOut[R]);
    }
  };
  if (only < 0) {
    onEveryRank(n, body);
  } else {
    body(only);
  }
  // Every rank's failure, the cause first: a rank that failed on its own (a timeout, a bad
  // argument) rather than because a peer aborted the communicator.
  std::string cause, echoes;
  for (int r = 0; r < n; ++r) {
    if (!mine(r)) continue;
    const auto R = static_cast<std::size_t>(r);
    std::string why = !st[R].isOk() ? st[R].toString() : async[R];
    if (why.empty()) continue;
    why = "rank " + std::to_string(r) + ": " + why;
    const bool echo = why.find("aborted") != std::string::npos;
    std::string& into = echo || !cause.empty() ? echoes : cause;
    into += (into.empty() ? "" : " | ") + why;
  }
  if (!cause.empty() || !echoes.empty())
    return cause.empty() ? echoes : echoes.empty() ? cause : cause + " | " + echoes;
  if (c.sameBits && c.coll == Collective::allReduce && only < 0) {
    for (int r = 1; r < n; ++r) {
      if (out[static_cast<std::size_t>(r)] != out[0])
        return "rank " + std::to_string(r) + "'s result differs in its bits from rank 0's";
    }
  }
  // The result buffer of each rank, and the expected value of each of its elements.
  for (int r = 0; r < n; ++r) {
    if (!mine(r)) continue;
    const auto R = static_cast<std::size_t>(r);
    std::vector<std::byte> got;
    if (c.inPlace && c.coll == Collective::reduceScatter) {
      got.assign(in[R].begin() + static_cast<std::ptrdiff_t>(R * c.count * es),
                 in[R].begin() + static_cast<std::ptrdiff_t>((R + 1) * c.count * es));
    } else {
      got = out[R];
    }
    if (std::string err = checkRank(c, n, r, original, got); !err.empty()) return err;
  }
  return "";
}

// The matrix every transport and launch runs: each collective x dtype x op, sizes from 0 to
// beyond a FIFO slot (the big one for common types only), in place and out of place, with
// seeds from 1. Returns the failures (at most 10 described).
inline std::vector<std::string> runMatrix(std::vector<Comm>& comms, int n, int only = -1,
                                          const DeviceMemory* gpu = nullptr) {
  std::vector<std::string> failures;
  std::uint64_t seed = 1;
  for (Collective coll : {Collective::allReduce, Collective::reduceScatter, Collective::reduce,
                          Collective::allGather, Collective::broadcast, Collective::allToAll}) {
    const bool reduces = isReduction(coll);
    for (DataType type : kAllDataTypes) {
      for (RedOp op : kAllRedOps) {
        if (!reduces && op != RedOp::sum) continue;
        for (std::size_t count : {0ul, 1ul, 7ul, 1023ul, 65537ul}) {
          if (count > 1023 && type != DataType::f32 && type != DataType::bf16 &&
              type != DataType::i8 && type != DataType::f8e4m3)
            continue;
          for (bool inPlace : {false, true}) {
            const int root =
                hasRoot(coll) ? static_cast<int>(seed % static_cast<std::uint64_t>(n)) : 0;
            const Case c{coll, type, op, count, inPlace, root};
            const std::string err = runCase(comms, c, seed++, n, only, gpu);
            if (!err.empty() && failures.size() < 10)
              failures.push_back(describe(c, n) + ": " + err);
          }
        }
      }
    }
  }
  return failures;
}

}  // namespace weft::test
