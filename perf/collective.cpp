#include "perf/collective.hpp"

#include <string>

namespace weft::perf {
namespace {

weftDataType_t c(DataType t) {
  return static_cast<weftDataType_t>(t);
}

}  // namespace

Status checked(weftResult_t r, const char* what) {
  if (r == weftSuccess) return {};
  return {static_cast<Code>(r), std::string(what) + ": " + weftGetLastError()};
}

Layout layoutFor(Collective c, std::size_t bytes, std::size_t elementSize, int nranks) {
  const std::size_t count = bytes / elementSize;
  const auto n = static_cast<std::size_t>(nranks);
  // Per-rank blocks are whole 16-byte lines, as nccl-tests makes them.
  const std::size_t base = (count / n) & ~(16 / elementSize - 1);
  Layout l;
  switch (c) {
    case Collective::allGather:
      l = {base, base, base * n, base, 0};
      break;
    case Collective::reduceScatter:
      l = {base, base * n, base, 0, base};
      break;
    case Collective::allToAll:
    case Collective::allToAllv:
      l = {base, base * n, base * n, 0, 0};
      break;
    case Collective::allReduce:
    case Collective::broadcast:
    case Collective::reduce:
    case Collective::sendRecv:
      l = {count, count, count, 0, 0};
      break;
  }
  return l;
}

Rotation rotationFor(std::size_t callBytes, std::size_t maxBytes) {
  if (callBytes == 0) return {};
  return {callBytes, std::max<std::size_t>(1, maxBytes / callBytes)};
}

double algBytes(Collective c, const Layout& l, std::size_t elementSize, int nranks) {
  const double perCall = static_cast<double>(l.count) * static_cast<double>(elementSize);
  switch (c) {
    case Collective::allGather:
    case Collective::reduceScatter:
    case Collective::allToAll:
    case Collective::allToAllv:
      return perCall * nranks;
    case Collective::allReduce:
    case Collective::broadcast:
    case Collective::reduce:
    case Collective::sendRecv:
      break;
  }
  return perCall;
}

double busFactor(Collective c, int nranks) {
  const double n = nranks;
  switch (c) {
    case Collective::allReduce:
      return 2 * (n - 1) / n;
    case Collective::allGather:
    case Collective::reduceScatter:
    case Collective::allToAll:
    case Collective::allToAllv:
      return (n - 1) / n;
    case Collective::broadcast:
    case Collective::reduce:
    case Collective::sendRecv:
      break;
  }
  return 1;
}

bool checksInPlace(Collective c) {
  return c != Collective::sendRecv;
}

bool fillsInput(Collective c, int rank, int root) {
  return c != Collective::broadcast || rank == root;
}

std::vector<Expect> expectations(Collective c, const Layout& l, int rank, int nranks, int root,
                                 bool inPlace) {
  using K = Expect::Kind;
  const std::size_t base = l.count;
  const auto self = static_cast<std::size_t>(rank);
  std::vector<Expect> out;
  switch (c) {
    case Collective::allReduce:
      out.push_back({K::reduced, 0, l.count, 0, 0});
      break;
    case Collective::allGather:
      for (int q = 0; q < nranks; ++q)
        out.push_back({K::copied, static_cast<std::size_t>(q) * base, base, q, 0});
      break;
    case Collective::reduceScatter:
      out.push_back({K::reduced, inPlace ? self * base : 0, base, 0, self * base});
      break;
    case Collective::broadcast:
      out.push_back({K::copied, 0, l.count, root, 0});
      break;
    case Collective::reduce:
      if (rank == root) {
        out.push_back({K::reduced, 0, l.count, 0, 0});
      } else {
        // Only the root's receive buffer is written; elsewhere it keeps what it held.
        out.push_back({inPlace ? K::copied : K::poisoned, 0, l.count, rank, 0});
      }
      break;
    case Collective::allToAll:
    case Collective::allToAllv:
      for (int q = 0; q < nranks; ++q)
        out.push_back({K::copied, static_cast<std::size_t>(q) * base, base, q, self * base});
      break;
    case Collective::sendRecv:
      out.push_back({K::copied, 0, l.count, (rank + nranks - 1) % nranks, 0});
      break;
  }
  return out;
}

Status launch(Collective coll, weftComm_t comm, const void* send, void* recv, const Layout& l,
              DataType type, RedOp op, int root, int rank, int nranks, void* stream,
              const weftCompression* compression) {
  const auto redop = static_cast<weftRedOp_t>(op);
  if (compression != nullptr) {
    switch (coll) {
      case Collective::allReduce:
        return checked(
            weftAllReduceEx(send, recv, l.count, c(type), redop, comm, stream, compression),
            "weftAllReduceEx");
      case Collective::allGather:
        return checked(weftAllGatherEx(send, recv, l.count, c(type), comm, stream, compression),
                       "weftAllGatherEx");
      case Collective::reduceScatter:
        return checked(
            weftReduceScatterEx(send, recv, l.count, c(type), redop, comm, stream, compression),
            "weftReduceScatterEx");
      default:
        break;
    }
  }
  switch (coll) {
    case Collective::allReduce:
      return checked(weftAllReduce(send, recv, l.count, c(type), redop, comm, stream),
                     "weftAllReduce");
    case Collective::allGather:
      return checked(weftAllGather(send, recv, l.count, c(type), comm, stream), "weftAllGather");
    case Collective::reduceScatter:
      return checked(weftReduceScatter(send, recv, l.count, c(type), redop, comm, stream),
                     "weftReduceScatter");
    case Collective::broadcast:
      return checked(weftBroadcast(send, recv, l.count, c(type), root, comm, stream),
                     "weftBroadcast");
    case Collective::reduce:
      return checked(weftReduce(send, recv, l.count, c(type), redop, root, comm, stream),
                     "weftReduce");
    case Collective::allToAll:
    case Collective::allToAllv:
      return checked(weftAllToAll(send, recv, l.count, c(type), comm, stream), "weftAllToAll");
    case Collective::sendRecv:
      break;
  }
  // A ring: send to the next rank, receive from the previous, both progressing together.
  const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  if (Status s = checked(weftGroupStart(), "weftGroupStart"); !s) return s;
  Status sent = checked(weftSend(send, l.count, c(type), next, comm, stream), "weftSend");
  Status received = checked(weftRecv(recv, l.count, c(type), prev, comm, stream), "weftRecv");
  Status ended = checked(weftGroupEnd(), "weftGroupEnd");
  if (!sent) return sent;
  if (!received) return received;
  return ended;
}

Status asyncError(weftComm_t comm) {
  weftResult_t error = weftSuccess;
  if (Status s = checked(weftCommGetAsyncError(comm, &error), "weftCommGetAsyncError"); !s)
    return s;
  return checked(error, "a GPU call, after it was enqueued");
}

PlanQuery planQuery(Collective coll, const Layout& l, DataType type) {
  if (coll == Collective::sendRecv) return {weftCollSendRecv, l.count * sizeOf(type), weftUint8};
  return {static_cast<weftCollective_t>(coll), l.count, c(type)};
}

}  // namespace weft::perf
