// Point-to-point on a communicator: send, receive, batches of both (groups) and all-to-all-v, on
// host memory through channel 0's connections (or single copy), on GPU memory by the executor.
#include <cstring>
#include <map>

#include "src/core/communicator.hpp"

namespace weft {
namespace {

// A point-to-point message that names the sender's buffer instead of carrying it.
constexpr std::uint64_t kSingleCopyMagic = 0x57454654'53494e47ull;
struct SingleCopy {
  std::uint64_t magic;
  std::uintptr_t address;
  std::uint64_t bytes;
};

}  // namespace

// Point-to-point streams through channel 0's FIFO in slot-sized messages; both sides know the
// count, so they agree on the slicing.
Status Communicator::send(const void* buf, std::size_t count, DataType type, int peer,
                          void* stream) {
  if (Status s = checkP2p("send", buf, count, type, peer); !s) return s;
  return exchange({{true, peer, static_cast<std::byte*>(const_cast<void*>(buf)),
                    count * sizeOf(type), stream}});
}

Status Communicator::recv(void* buf, std::size_t count, DataType type, int peer, void* stream) {
  if (Status s = checkP2p("recv", buf, count, type, peer); !s) return s;
  return exchange({{false, peer, static_cast<std::byte*>(buf), count * sizeOf(type), stream}});
}

Status Communicator::exchange(std::vector<P2pOp> ops) {
  if (ops.empty()) return {};
  // GPU buffers (every operation of the batch that moves bytes, on one stream), or host buffers
  // (no stream).
  std::size_t onGpu = 0, moving = 0;
  for (const P2pOp& op : ops) {
    if (op.bytes == 0) continue;
    ++moving;
    onGpu += exec::isDevicePointer(op.buf) ? 1 : 0;
  }
  if (onGpu > 0 && onGpu < moving) {
    return Status(Code::invalidUsage, "rank " + std::to_string(rank_) +
                                          ": a batch of sends and receives mixes GPU and host "
                                          "buffers; use one kind per group");
  }
  for (const P2pOp& op : ops) {
    if (op.stream != ops.front().stream) {
      return Status(Code::invalidUsage, "rank " + std::to_string(rank_) +
                                            ": the sends and receives of one group must use "
                                            "one stream");
    }
    // Operations of no bytes are no-ops on either path (as in NCCL), whatever their buffers.
    if (onGpu == 0 && moving > 0 && op.stream != nullptr) {
      return Status(Code::invalidUsage,
                    std::string(op.isSend ? "send" : "recv") +
                        ": a stream was given with host buffers (streams order calls on GPU "
                        "buffers; pass NULL)");
    }
  }
  // To itself (as NCCL allows inside a group): the k-th send meets the k-th receive, checked
  // before anything moves.
  std::vector<const P2pOp*> selfSends, selfRecvs;
  for (const P2pOp& op : ops) {
    if (op.peer == rank_) (op.isSend ? selfSends : selfRecvs).push_back(&op);
  }
  if (selfSends.size() != selfRecvs.size()) {
    return invalidArgument("rank " + std::to_string(rank_) + ": " +
                           std::to_string(selfSends.size()) + " send(s) to itself but " +
                           std::to_string(selfRecvs.size()) +
                           " receive(s) from itself; each needs its match in the same group");
  }
  for (std::size_t k = 0; k < selfSends.size(); ++k) {
    if (selfSends[k]->bytes != selfRecvs[k]->bytes) {
      return invalidArgument("rank " + std::to_string(rank_) + ": a send to itself of " +
                             std::to_string(selfSends[k]->bytes) + " bytes meets a receive of " +
                             std::to_string(selfRecvs[k]->bytes));
    }
  }
  if (onGpu > 0) {
    if (Status s = checkUsable("send/recv"); !s) return s;
    if (!exec::cudaBuilt())
      return Status(Code::unsupported, "send/recv: GPU buffers, but this build has no CUDA");
    if (Status s = ensureGpu(); !s) return s;
    if (config_.checkCalls) {
      if (Status s = checkOps(ops, OpsCheck::gpu); !s) return s;
    }
    gpu_->sign(config_.checkCalls ? 1 : 0);  // each message signed with its operation's size
    std::vector<exec::CudaExecutor::P2p> batch;
    for (const P2pOp& op : ops) batch.push_back({op.isSend, op.peer, op.buf, op.bytes});
    // Ordered after the communicator's previous operation, as a collective is.
    void* stream = ops.front().stream;
    if (Status s = gpu_->begin(stream); !s) return fail(s);
    if (Status s = gpu_->exchange(batch, stream); !s) return fail(s);
    if (Status s = gpu_->end(stream); !s) return fail(s);
    return {};
  }
  for (std::size_t k = 0; k < selfSends.size(); ++k) {
    if (selfSends[k]->bytes > 0)
      std::memmove(selfRecvs[k]->buf, selfSends[k]->buf, selfSends[k]->bytes);
  }
  // Every receive's size against its send's before anything moves (WEFT_CHECK_CALLS); through
  // UCX each message's size is compared on arrival instead (unsigned: no call's signature).
  if (config_.checkCalls) {
    if (Status s = checkOps(ops, OpsCheck::before); !s) return s;
    if (ucx_) ucx_->sign(0);
  }
  // Per (direction, peer): the operations in call order; only the first unfinished one moves.
  // Sends come first in each pass, so a rank names its buffers before it spends a single-copy
  // read on a peer's: with receives first, two ranks exchanging 1 MB took turns, each posting
  // only after its own read (267 us a call on the 2-core VM where one read takes ~60).
  std::map<std::pair<bool, int>, std::vector<std::size_t>> lanes;  // key: (receives, peer)
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].bytes > 0 && ops[i].peer != rank_) lanes[{!ops[i].isSend, ops[i].peer}].push_back(i);
  }
  struct Lane {
    std::vector<std::size_t> ops;
    std::size_t next = 0, done = 0;  // which op, and its bytes moved so far
    bool posted = false;             // single copy: the descriptor is out, awaiting release
  };
  std::vector<Lane> active;
  for (auto& [key, list] : lanes) active.push_back({std::move(list)});
  std::size_t open = active.size();
  Status failure;
  const std::size_t slot = geometry_.slotBytes;
  auto mismatch = [&](const P2pOp& op) {
    return Status(Code::invalidUsage, "rank " + std::to_string(rank_) + ": receive from rank " +
                                          std::to_string(op.peer) + " of " +
                                          std::to_string(op.bytes) +
                                          " bytes met a send of a different size");
  };
  auto progress = [&] {
    bool moved = false;
    for (Lane& l : active) {
      if (l.next == l.ops.size()) continue;
      P2pOp& op = ops[l.ops[l.next]];
      const auto Q = static_cast<std::size_t>(op.peer);
      std::size_t n = std::min(slot, op.bytes - l.done);
      if (op.isSend && (l.posted || (l.done == 0 && namesTo(Q, op.bytes)))) {
        // One message names the buffer; the receiver reads it and releases the message, after
        // which the buffer is the caller's again.
        transport::Connection* c = links_[0].to[Q];
        if (!l.posted) {
          std::byte* dst = c->tryAcquire();
          if (dst == nullptr) continue;
          const SingleCopy d{kSingleCopyMagic, reinterpret_cast<std::uintptr_t>(op.buf), op.bytes};
          transport::handOff(op.buf);
          std::memcpy(dst, &d, sizeof d);
          c->postReference(sizeof d);
          l.posted = moved = true;
          continue;
        }
        if (!c->drained()) continue;
        transport::takeOver(op.buf);
        l.posted = false;
        n = op.bytes;
      } else if (op.isSend) {
        std::byte* dst = links_[0].to[Q]->tryAcquire();
        if (dst == nullptr) continue;
        std::memcpy(dst, op.buf + l.done, n);
        links_[0].to[Q]->post(n);
      } else {
        transport::Connection* c = links_[0].from[Q];
        auto m = c->tryReceive();
        if (!m) continue;
        if (c->isReference()) {
          SingleCopy d{};
          if (m->size() == sizeof d) std::memcpy(&d, m->data(), sizeof d);
          if (d.magic != kSingleCopyMagic || d.bytes != op.bytes) {
            c->release();
            failure = mismatch(op);
            return true;
          }
          failure = readRate_->read(peerMemory_[Q], op.buf, d.address, op.bytes);
          c->release();
          if (!failure.isOk()) return true;
          n = op.bytes;
        } else {
          if (m->size() != n) {
            c->release();
            failure = mismatch(op);
            return true;
          }
          std::memcpy(op.buf + l.done, m->data(), n);
          c->release();
        }
      }
      moved = true;
      l.done += n;
      if (l.done == op.bytes) {
        l.done = 0;
        if (++l.next == l.ops.size()) --open;
      }
    }
    return moved || open == 0;
  };
  while (open > 0) {
    int waitingOn = rank_;
    for (const Lane& l : active) {
      if (l.next < l.ops.size()) waitingOn = ops[l.ops[l.next]].peer;
    }
    if (Status s = waiter_->wait(progress, "exchanging with", waitingOn); !s) return fail(s);
    if (!failure.isOk()) return fail(failure);
  }
  if (ucx_) {
    if (Status s = ucx_->flush(0, *waiter_); !s) return fail(s);
  }
  if (config_.checkCalls)
    return checkOps(ops, OpsCheck::after);  // each send, where its receive posted
  return {};
}

Status Communicator::allToAllv(const void* send, const std::size_t* sendCounts,
                               const std::size_t* sendDispls, void* recv,
                               const std::size_t* recvCounts, const std::size_t* recvDispls,
                               DataType type, void* stream) {
  const char* what = "allToAllv";
  if (Status s = checkAllToAllv(send, sendCounts, sendDispls, recv, recvCounts, recvDispls, type);
      !s)
    return s;
  const auto self = static_cast<std::size_t>(rank_);
  std::size_t sent = 0;  // cannot wrap: each count is below PTRDIFF_MAX / size_ elements
  for (int q = 0; q < size_; ++q) sent += sendCounts[static_cast<std::size_t>(q)];
  if (Status s = checkUsable(what); !s) return s;
  // The tuner's plan fixes the order of the exchanges; the point-to-point engine runs them.
  auto plan = planFor(Collective::allToAllv, sent * sizeOf(type));
  if (!plan) return plan.status();
  auto cached = scheduleFor(Collective::allToAllv, *plan, 0, geometry_.channels);
  if (!cached) return cached.status();
  const algo::Program& p = (*cached)->schedule.program(0, rank_);
  const std::size_t es = sizeOf(type);
  auto* in = static_cast<std::byte*>(const_cast<void*>(send));
  auto* out = static_cast<std::byte*>(recv);
  std::vector<P2pOp> ops;
  for (const algo::Step& st : p.steps()) {
    for (int q : p.sendPeers(st)) {
      const auto Q = static_cast<std::size_t>(q);
      ops.push_back({true, q, in + sendDispls[Q] * es, sendCounts[Q] * es, stream});
    }
    for (int q : p.recvPeers(st)) {
      const auto Q = static_cast<std::size_t>(q);
      ops.push_back({false, q, out + recvDispls[Q] * es, recvCounts[Q] * es, stream});
    }
  }
  // Its own block: a send to itself that the batch pairs with the receive (a memmove on the
  // host, a device copy on the stream).
  if (sendCounts[self] > 0) {
    ops.push_back({true, rank_, in + sendDispls[self] * es, sendCounts[self] * es, stream});
    ops.push_back({false, rank_, out + recvDispls[self] * es, recvCounts[self] * es, stream});
  }
  return exchange(std::move(ops));
}

}  // namespace weft
