// The arguments of the collectives and point-to-point calls, checked before anything moves: by
// each call, and by a group when it queues one (weft.h). The C ABI has checked the dtype and op.
#include <algorithm>
#include <cstdint>
#include <string>

#include "src/core/arguments.hpp"
#include "src/core/communicator.hpp"

namespace weft {

Status checkBuffers(const char* what, const void* send, const void* recv, std::size_t count,
                    bool needSend, bool needRecv) {
  if (count > 0 && needSend && send == nullptr)
    return invalidArgument(std::string(what) + ": sendbuff is NULL with count " +
                           std::to_string(count));
  if (count > 0 && needRecv && recv == nullptr)
    return invalidArgument(std::string(what) + ": recvbuff is NULL with count " +
                           std::to_string(count));
  return {};
}

// The largest buffer a call may name: the largest object C++ allows (pointer differences stay
// defined), far beyond any memory.
constexpr std::size_t kMaxBufferBytes = static_cast<std::size_t>(PTRDIFF_MAX);

Status checkCount(const char* what, std::size_t count, std::size_t segments, DataType type) {
  const std::size_t limit = kMaxBufferBytes / (segments * std::max<std::size_t>(1, sizeOf(type)));
  if (count > limit)
    return invalidArgument(std::string(what) + ": count " + std::to_string(count) +
                           " makes a buffer larger than the largest possible (" +
                           std::to_string(limit) + " elements of " + std::string(name(type)) +
                           (segments > 1 ? " per rank" : "") + ")");
  return {};
}

// A buffer of `bytes` at `at` must end inside the address space.
Status checkSpan(const char* what, const char* buffer, const void* at, std::size_t bytes) {
  const auto start = reinterpret_cast<std::uintptr_t>(at);
  if (at != nullptr && bytes > 0 && start > UINTPTR_MAX - bytes)
    return invalidArgument(std::string(what) + ": " + buffer + " of " + std::to_string(bytes) +
                           " bytes runs past the end of the address space");
  return {};
}

Status Communicator::check(Collective coll, const void* send, const void* recv, std::size_t count,
                           DataType type, int root) const {
  const char* what = name(coll).data();
  const auto n = static_cast<std::size_t>(size_);
  const bool rooted = coll == Collective::broadcast || coll == Collective::reduce;
  if (rooted && (root < 0 || root >= size_))
    return invalidArgument(std::string(what) + ": root " + std::to_string(root) +
                           " is not a rank of this " + std::to_string(size_) +
                           "-rank communicator");
  // Elements of the send and receive buffers, in units of count.
  std::size_t in = 1, out = 1;
  bool needSend = true, needRecv = true;
  switch (coll) {
    case Collective::allGather:
      out = n;
      break;
    case Collective::reduceScatter:
      in = n;
      break;
    case Collective::allToAll:
      in = out = n;
      break;
    case Collective::broadcast:
      needSend = rank_ == root;
      break;
    case Collective::reduce:
      needRecv = rank_ == root;
      break;
    default:
      break;
  }
  if (Status s = checkBuffers(what, send, recv, count, needSend, needRecv); !s) return s;
  if (Status s = checkCount(what, count, std::max(in, out), type); !s) return s;
  const std::size_t es = sizeOf(type);
  if (Status s = checkSpan(what, "sendbuff", needSend ? send : nullptr, count * in * es); !s)
    return s;
  return checkSpan(what, "recvbuff", needRecv ? recv : nullptr, count * out * es);
}

Status Communicator::checkP2p(const char* what, const void* buf, std::size_t count, DataType type,
                              int peer) const {
  if (peer < 0 || peer >= size_)
    return invalidArgument(std::string(what) + ": peer " + std::to_string(peer) +
                           " is not a rank of this " + std::to_string(size_) +
                           "-rank communicator");
  if (Status s = checkBuffers(what, buf, buf, count, true, false); !s) return s;
  if (Status s = checkCount(what, count, 1, type); !s) return s;
  return checkUsable(what);
}

Status Communicator::checkAllToAllv(const void* send, const std::size_t* sendCounts,
                                    const std::size_t* sendDispls, const void* recv,
                                    const std::size_t* recvCounts, const std::size_t* recvDispls,
                                    DataType type) const {
  const char* what = "allToAllv";
  if (sendCounts == nullptr || sendDispls == nullptr || recvCounts == nullptr ||
      recvDispls == nullptr)
    return invalidArgument("allToAllv: counts and displacements must not be NULL");
  const std::size_t es = sizeOf(type);
  // Each count below PTRDIFF_MAX / size_ elements (so their sum cannot wrap), each extent
  // (displacement + count) at most PTRDIFF_MAX bytes, each buffer inside the address space.
  const std::size_t countLimit = kMaxBufferBytes / es / static_cast<std::size_t>(size_);
  const std::size_t extentLimit = kMaxBufferBytes / es;
  auto extent = [&](const char* side, const char* buffer, const void* base,
                    const std::size_t* counts, const std::size_t* displs) -> Status {
    std::size_t most = 0;
    for (int q = 0; q < size_; ++q) {
      const auto Q = static_cast<std::size_t>(q);
      const std::string at = "[" + std::to_string(q) + "] = ";
      if (counts[Q] > countLimit)
        return invalidArgument("allToAllv: " + std::string(side) + "counts" + at +
                               std::to_string(counts[Q]) + " exceeds " +
                               std::to_string(countLimit) + " elements (PTRDIFF_MAX bytes over " +
                               std::to_string(size_) + " ranks)");
      if (counts[Q] == 0) continue;
      if (displs[Q] > extentLimit - counts[Q])
        return invalidArgument("allToAllv: " + std::string(side) + "displs" + at +
                               std::to_string(displs[Q]) + " plus its count " +
                               std::to_string(counts[Q]) + " exceeds " +
                               std::to_string(extentLimit) + " elements (PTRDIFF_MAX bytes)");
      most = std::max(most, displs[Q] + counts[Q]);
    }
    if (most > 0 && base == nullptr)
      return invalidArgument("allToAllv: " + std::string(buffer) + " is NULL with " +
                             std::to_string(most) + " elements to move");
    return checkSpan(what, buffer, base, most * es);
  };
  if (Status s = extent("send", "sendbuff", send, sendCounts, sendDispls); !s) return s;
  if (Status s = extent("recv", "recvbuff", recv, recvCounts, recvDispls); !s) return s;
  const auto self = static_cast<std::size_t>(rank_);
  if (sendCounts[self] != recvCounts[self])
    return invalidArgument("allToAllv: rank " + std::to_string(rank_) + " sends itself " +
                           std::to_string(sendCounts[self]) + " elements but receives " +
                           std::to_string(recvCounts[self]));
  return {};
}

}  // namespace weft
