// The C ABI: validates handles, turns Status into codes and the last-error message, and never
// lets an exception out.
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "src/bootstrap/bootstrap.hpp"
#include "src/core/c_api_calls.hpp"
#include "src/core/communicator.hpp"
#include "src/core/log.hpp"
#include "src/exec/cuda_executor.hpp"
#include "src/transport/host_alloc.hpp"
#include "weft/status.hpp"
#include "weft/types.hpp"
#include "weft/weft.h"

using namespace weft::capi;  // NOLINT: the entry points below are its users

namespace {

weftResult_t checkRanks(const char* what, int nranks) {
  if (nranks >= 1 && nranks <= WEFT_MAX_RANKS) return weftSuccess;
  return invalid(std::string(what) + ": nranks " + std::to_string(nranks) +
                 " is outside [1, WEFT_MAX_RANKS = " + std::to_string(WEFT_MAX_RANKS) + "]");
}

// The settings of a new communicator (or id): the log's are read again first, so a failure of
// the rest is printed as the log's settings say.
weft::Result<weft::Config> config() {
  weft::log::configure();
  return weft::Config::fromEnvironment();
}

weft::boot::BootstrapOptions bootOptions(const weft::Config& c) {
  weft::boot::BootstrapOptions o;
  o.timeoutSeconds = static_cast<double>(c.timeout.count()) / 1000.0;
  o.ifname = c.socketIfname;
  return o;
}

weftComm_t adopt(std::unique_ptr<weft::Communicator> impl) {
  auto c = std::make_shared<weftComm>();
  c->impl = std::move(impl);
  c->summary = c->impl->summary();
  std::lock_guard<std::mutex> lock(gLiveMutex);
  gLive.emplace(c.get(), c);
  return c.get();
}

// Runs job(0..n-1) on n threads of their own, or on none: every thread is started first and
// waits for the others, so a thread that cannot be started (std::system_error) lets the started
// ones return at once, having done nothing, and the call fails with systemError.
weft::Status onThreads(std::size_t n, const std::function<void(std::size_t)>& job,
                       const char* what) {
  std::mutex m;
  std::condition_variable cv;
  int go = 0;  // 1: run, -1: give up
  auto gate = [&](std::size_t i) {
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return go != 0; });
      if (go < 0) return;
    }
    job(i);
  };
  std::vector<std::thread> threads;
  weft::Status started;
  try {
    threads.reserve(n);
    for (std::size_t i = 0; i < n; ++i) threads.emplace_back(gate, i);
  } catch (...) {
    started = caught(what);
    if (started.isOk()) started = {weft::Code::systemError, std::string(what) + ": no thread"};
  }
  {
    std::lock_guard<std::mutex> lock(m);
    go = started.isOk() ? 1 : -1;
  }
  cv.notify_all();
  for (std::thread& t : threads) t.join();
  if (!started.isOk()) {
    return {weft::Code::systemError, started.message() + " (" + std::to_string(threads.size()) +
                                         " of " + std::to_string(n) +
                                         " threads started; none ran)"};
  }
  return {};
}

}  // namespace

extern "C" {

// The log's one line for the NCCL interface (src/core/log.hpp); defined here, in libweft's own
// object, as --exclude-libs hides what the static runtime defines.
void weftLogLine(int level, unsigned subsys, const char* message) {
  if (level < 0 || level > static_cast<int>(weft::log::Level::trace) || message == nullptr) return;
  weft::log::write(static_cast<weft::log::Level>(level), subsys, "%s", message);
}

weftResult_t weftGetVersion(int* version) {
  if (version == nullptr)
    return invalid("weftGetVersion: version is NULL; pass the address of an int");
  *version = WEFT_VERSION_CODE;
  return weftSuccess;
}

const char* weftGetErrorString(weftResult_t result) {
  if (static_cast<int>(result) < 0 || result >= weftNumResults) return "unknown result";
  // name() returns views of string literals, which are NUL-terminated.
  return weft::name(static_cast<weft::Code>(result)).data();
}

const char* weftGetLastError(void) {
  return gLastError.c_str();
}

size_t weftTypeSize(weftDataType_t type) {
  if (static_cast<int>(type) < 0 || type >= weftNumDataTypes) return 0;
  return weft::sizeOf(static_cast<weft::DataType>(type));
}

weftResult_t weftGetUniqueId(weftUniqueId* uniqueId) {
  if (uniqueId == nullptr) return invalid("weftGetUniqueId: uniqueId is NULL");
  try {
    auto cfg = config();
    if (!cfg) return report(cfg.status());
    if (!cfg->commId.empty() && cfg->commSecret.empty()) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        WEFT_WARN(weft::log::kInit | weft::log::kBootstrap,
                  "WEFT_COMM_ID=%s without WEFT_COMM_SECRET: the rendezvous is unauthenticated "
                  "(anyone who can reach that address can join; docs/security.md)",
                  cfg->commId.c_str());
      });
    }
    auto id = cfg->commId.empty() ? weft::boot::createUniqueId(bootOptions(*cfg))
                                  : weft::boot::uniqueIdFromAddress(cfg->commId, cfg->commSecret);
    if (!id) return report(id.status());
    static_assert(sizeof(weftUniqueId) == sizeof(weft::boot::UniqueId));
    std::memcpy(uniqueId->internal, id->bytes, sizeof id->bytes);
    return weftSuccess;
  } catch (...) {
    return report(caught("weftGetUniqueId"));
  }
}

weftResult_t weftCommInitRank(weftComm_t* comm, int nranks, weftUniqueId uniqueId, int rank) {
  if (comm == nullptr) return invalid("weftCommInitRank: comm is NULL");
  if (weftResult_t r = checkRanks("weftCommInitRank", nranks); r != weftSuccess) return r;
  if (rank < 0 || rank >= nranks)
    return invalid("weftCommInitRank: rank " + std::to_string(rank) + " is outside [0, " +
                   std::to_string(nranks) + ")");
  const weft::log::RankScope scope(rank);
  try {
    auto cfg = config();
    if (!cfg) return report(cfg.status());
    weft::boot::UniqueId id;
    std::memcpy(id.bytes, uniqueId.internal, sizeof id.bytes);
    auto boot = weft::boot::connectTcp(id, rank, nranks, bootOptions(*cfg),
                                       weft::boot::rankStartsRoot(id, rank));
    if (!boot) return report(boot.status());
    auto impl = weft::Communicator::create(std::move(*boot), *cfg);
    if (!impl) return report(impl.status());
    *comm = adopt(std::move(*impl));
    return weftSuccess;
  } catch (...) {
    return report(caught("weftCommInitRank"));
  }
}

weftResult_t weftCommInitAll(weftComm_t* comms, int nranks) {
  if (comms == nullptr) return invalid("weftCommInitAll: comms is NULL");
  if (weftResult_t r = checkRanks("weftCommInitAll", nranks); r != weftSuccess) return r;
  try {
    auto cfg = config();
    if (!cfg) return report(cfg.status());
    auto boots = weft::boot::makeInProcess(nranks, bootOptions(*cfg));
    if (!boots) return report(boots.status());
    // Creation is collective: one thread per rank.
    std::vector<std::unique_ptr<weft::Communicator>> made(static_cast<std::size_t>(nranks));
    std::vector<weft::Status> status(made.size());
    weft::Status ran = onThreads(
        made.size(),
        [&](std::size_t r) {
          const weft::log::RankScope scope(static_cast<int>(r));
          try {
            auto c = weft::Communicator::create(std::move((*boots)[r]), *cfg);
            if (c) {
              made[r] = std::move(*c);
            } else {
              status[r] = c.status();
            }
          } catch (...) {
            status[r] = caught("weftCommInitAll");
          }
        },
        "weftCommInitAll");
    if (!ran) return report(ran);
    for (const weft::Status& s : status) {
      if (!s.isOk()) return report(s);
    }
    // Adopted all or none: a failed adoption frees the ones before it.
    std::vector<weftComm_t> out;
    try {
      for (auto& m : made) out.push_back(adopt(std::move(m)));
    } catch (...) {
      for (weftComm_t c : out) (void)weftCommDestroy(c);
      throw;
    }
    std::copy(out.begin(), out.end(), comms);
    return weftSuccess;
  } catch (...) {
    return report(caught("weftCommInitAll"));
  }
}

weftResult_t weftCommSplit(weftComm_t comm, int color, int key, weftComm_t* newcomm) {
  if (newcomm == nullptr) return invalid("weftCommSplit: newcomm is NULL");
  if (color < WEFT_SPLIT_NOCOLOR)
    return invalid("weftCommSplit: color " + std::to_string(color) +
                   " is negative; use WEFT_SPLIT_NOCOLOR to take no part");
  return withComm(comm, "weftCommSplit", [&](weft::Communicator& c) {
    auto made = c.split(color, key);
    if (!made) return made.status();
    *newcomm = *made ? adopt(std::move(*made)) : nullptr;
    return weft::Status{};
  });
}

weftResult_t weftCommDestroy(weftComm_t comm) {
  std::shared_ptr<weftComm> c;
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    auto it = gLive.find(comm);
    if (comm == nullptr || it == gLive.end())
      return invalid("weftCommDestroy: comm is not a live communicator");
    c = std::move(it->second);
    gLive.erase(it);
  }
  // Waits for the calls inside it (a stuck one ends at its timeout or at weftCommAbort), then
  // frees it here; calls that hold it and have not started are refused.
  std::unique_ptr<weft::Communicator> impl;
  {
    std::unique_lock<std::mutex> lock(c->state);
    c->destroying = true;
    c->idle.wait(lock, [&] { return c->inflight == 0; });
    impl = std::move(c->impl);
  }
  impl.reset();
  return weftSuccess;
}

weftResult_t weftCommAbort(weftComm_t comm) {
  return withComm(
      comm, "weftCommAbort",
      [](weft::Communicator& c) {
        c.abort("rank " + std::to_string(c.rank()) + " called weftCommAbort");
        return weft::Status{};
      },
      false);
}

weftResult_t weftCommCount(weftComm_t comm, int* count) {
  if (count == nullptr) return invalid("weftCommCount: count is NULL");
  return withComm(
      comm, "weftCommCount",
      [&](weft::Communicator& c) {
        *count = c.size();
        return weft::Status{};
      },
      false);
}

weftResult_t weftCommUserRank(weftComm_t comm, int* rank) {
  if (rank == nullptr) return invalid("weftCommUserRank: rank is NULL");
  return withComm(
      comm, "weftCommUserRank",
      [&](weft::Communicator& c) {
        *rank = c.rank();
        return weft::Status{};
      },
      false);
}

weftResult_t weftCommDevice(weftComm_t comm, int* device) {
  if (device == nullptr) return invalid("weftCommDevice: device is NULL");
  return withComm(comm, "weftCommDevice", [&](weft::Communicator& c) {
    *device = c.device();
    return weft::Status{};
  });
}

weftResult_t weftCommGetAsyncError(weftComm_t comm, weftResult_t* asyncError) {
  if (asyncError == nullptr) return invalid("weftCommGetAsyncError: asyncError is NULL");
  return withComm(comm, "weftCommGetAsyncError", [&](weft::Communicator& c) {
    const weft::Status s = c.asyncError();
    *asyncError = static_cast<weftResult_t>(s.code());
    if (!s.isOk()) gLastError = s.message();
    return weft::Status{};
  });
}

const char* weftCommSummary(weftComm_t comm) {
  try {
    Inside in(find(comm), false);
    if (!in) return "";
    // The first GPU call adds the GPU transport to the line.
    weftComm& c = *in;
    const std::lock_guard<std::mutex> lock(c.calls);
    if (std::string now = c.impl->summary(); now != c.summary) c.summary = std::move(now);
    return c.summary.c_str();
  } catch (...) {
    return "";
  }
}

weftResult_t weftCommPlan(weftComm_t comm, weftCollective_t coll, size_t count,
                          weftDataType_t datatype, char* buf, size_t len) {
  return weftCommPlanMemory(comm, coll, count, datatype, weftHostMemory, buf, len);
}

weftResult_t weftCommPlanMemory(weftComm_t comm, weftCollective_t coll, size_t count,
                                weftDataType_t datatype, weftMemory_t memory, char* buf,
                                size_t len) {
  if (static_cast<int>(coll) < 0 || coll >= weftNumCollectives)
    return invalid("weftCommPlan: invalid collective " + std::to_string(static_cast<int>(coll)));
  if (memory != weftHostMemory && memory != weftGpuMemory)
    return invalid("weftCommPlan: invalid memory " + std::to_string(static_cast<int>(memory)));
  if (weftResult_t r = checkArgs("weftCommPlan", datatype, weftSum, nullptr); r != weftSuccess)
    return r;
  if (buf == nullptr || len == 0) return invalid("weftCommPlan: buf is NULL or len is 0");
  return withComm(comm, "weftCommPlan", [&](weft::Communicator& c) -> weft::Status {
    auto plan = c.planFor(static_cast<weft::Collective>(coll), count,
                          static_cast<weft::DataType>(datatype), memory == weftGpuMemory);
    if (!plan) return plan.status();
    std::snprintf(buf, len, "%s/%s", plan->algorithm.c_str(),
                  std::string(weft::algo::name(plan->protocol)).c_str());
    return {};
  });
}

weftResult_t weftAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           weftDataType_t datatype, weftRedOp_t op, weftComm_t comm, void* stream) {
  if (weftResult_t r = checkArgs("weftAllReduce", datatype, op, stream); r != weftSuccess) return r;
  return collective(comm, "weftAllReduce",
                    checked(weft::Collective::allReduce, sendbuff, recvbuff, count, datatype, 0),
                    [=](weft::Communicator& c) {
                      return c.allReduce(sendbuff, recvbuff, count,
                                         static_cast<weft::DataType>(datatype),
                                         static_cast<weft::RedOp>(op), stream);
                    });
}

weftResult_t weftAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           weftDataType_t datatype, weftComm_t comm, void* stream) {
  if (weftResult_t r = checkArgs("weftAllGather", datatype, weftSum, stream); r != weftSuccess)
    return r;
  return collective(
      comm, "weftAllGather",
      checked(weft::Collective::allGather, sendbuff, recvbuff, sendcount, datatype, 0),
      [=](weft::Communicator& c) {
        return c.allGather(sendbuff, recvbuff, sendcount, static_cast<weft::DataType>(datatype),
                           stream);
      });
}

weftResult_t weftReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                               void* stream) {
  if (weftResult_t r = checkArgs("weftReduceScatter", datatype, op, stream); r != weftSuccess)
    return r;
  return collective(
      comm, "weftReduceScatter",
      checked(weft::Collective::reduceScatter, sendbuff, recvbuff, recvcount, datatype, 0),
      [=](weft::Communicator& c) {
        return c.reduceScatter(sendbuff, recvbuff, recvcount, static_cast<weft::DataType>(datatype),
                               static_cast<weft::RedOp>(op), stream);
      });
}

weftResult_t weftBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           weftDataType_t datatype, int root, weftComm_t comm, void* stream) {
  if (weftResult_t r = checkArgs("weftBroadcast", datatype, weftSum, stream); r != weftSuccess)
    return r;
  return collective(comm, "weftBroadcast",
                    checked(weft::Collective::broadcast, sendbuff, recvbuff, count, datatype, root),
                    [=](weft::Communicator& c) {
                      return c.broadcast(sendbuff, recvbuff, count,
                                         static_cast<weft::DataType>(datatype), root, stream);
                    });
}

weftResult_t weftReduce(const void* sendbuff, void* recvbuff, size_t count, weftDataType_t datatype,
                        weftRedOp_t op, int root, weftComm_t comm, void* stream) {
  if (weftResult_t r = checkArgs("weftReduce", datatype, op, stream); r != weftSuccess) return r;
  return collective(comm, "weftReduce",
                    checked(weft::Collective::reduce, sendbuff, recvbuff, count, datatype, root),
                    [=](weft::Communicator& c) {
                      return c.reduce(sendbuff, recvbuff, count,
                                      static_cast<weft::DataType>(datatype),
                                      static_cast<weft::RedOp>(op), root, stream);
                    });
}

weftResult_t weftAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          weftDataType_t datatype, weftComm_t comm, void* stream) {
  if (weftResult_t r = checkArgs("weftAllToAll", datatype, weftSum, stream); r != weftSuccess)
    return r;
  return collective(comm, "weftAllToAll",
                    checked(weft::Collective::allToAll, sendbuff, recvbuff, count, datatype, 0),
                    [=](weft::Communicator& c) {
                      return c.allToAll(sendbuff, recvbuff, count,
                                        static_cast<weft::DataType>(datatype), stream);
                    });
}

namespace {

// A send or receive: checked now, then run alone, or queued when a group is open.
weftResult_t pointToPoint(bool isSend, void* buf, size_t count, weftDataType_t datatype, int peer,
                          weftComm_t comm, void* stream, const char* what) {
  if (weftResult_t r = checkArgs(what, datatype, weftSum, stream); r != weftSuccess) return r;
  const auto type = static_cast<weft::DataType>(datatype);
  return withComm(comm, what, [&](weft::Communicator& c) {
    if (weft::Status s = c.checkP2p(what, buf, count, type, peer); !s) return s;
    weft::Communicator::P2pOp op{isSend, peer, static_cast<std::byte*>(buf),
                                 count * weft::sizeOf(type), stream};
    if (gGroupDepth > 0) {
      gGroup.push_back({comm, op, nullptr, weft::exec::currentDevice()});
      return weft::Status{};
    }
    return c.exchange({op});
  });
}

}  // namespace

weftResult_t weftSend(const void* sendbuff, size_t count, weftDataType_t datatype, int peer,
                      weftComm_t comm, void* stream) {
  return pointToPoint(true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream,
                      "weftSend");
}

weftResult_t weftRecv(void* recvbuff, size_t count, weftDataType_t datatype, int peer,
                      weftComm_t comm, void* stream) {
  return pointToPoint(false, recvbuff, count, datatype, peer, comm, stream, "weftRecv");
}

weftResult_t weftAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                           void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                           weftDataType_t datatype, weftComm_t comm, void* stream) {
  if (weftResult_t r = checkArgs("weftAllToAllv", datatype, weftSum, stream); r != weftSuccess)
    return r;
  return collective(
      comm, "weftAllToAllv",
      [=](const weft::Communicator& c) {
        return c.checkAllToAllv(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls,
                                static_cast<weft::DataType>(datatype));
      },
      [=](weft::Communicator& c) {
        return c.allToAllv(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls,
                           static_cast<weft::DataType>(datatype), stream);
      });
}

weftResult_t weftGroupStart(void) {
  ++gGroupDepth;
  return weftSuccess;
}

weftResult_t weftGroupEnd(void) {
  if (gGroupDepth == 0)
    return fail(weftInvalidUsage, "weftGroupEnd without a matching weftGroupStart");
  if (--gGroupDepth > 0) return weftSuccess;
  std::vector<Queued> queued = std::move(gGroup);
  gGroup.clear();
  try {
    // Per communicator, in first-call order: its point-to-point batch, then its collectives.
    std::vector<weftComm*> order;
    std::map<weftComm*, std::vector<const Queued*>> byComm;
    for (const Queued& q : queued) {
      if (byComm.count(q.comm) == 0) order.push_back(q.comm);
      byComm[q.comm].push_back(&q);
    }
    std::vector<weft::Status> results(order.size());
    auto runOne = [&](std::size_t i) {
      weftComm* comm = order[i];
      try {
        weft::exec::useDevice(byComm[comm].front()->device);
        std::vector<weft::Communicator::P2pOp> ops;
        for (const Queued* q : byComm[comm]) {
          if (q->p2p) ops.push_back(*q->p2p);
        }
        Inside in(find(comm), false);
        if (!in) {
          results[i] = {weft::Code::invalidArgument,
                        "weftGroupEnd: a communicator was destroyed inside the group"};
          return;
        }
        const std::lock_guard<std::mutex> lock((*in).calls);
        weft::Communicator& c = *(*in).impl;
        if (!ops.empty()) results[i] = c.exchange(std::move(ops));
        for (const Queued* q : byComm[comm]) {
          if (!results[i].isOk()) break;
          if (q->coll) results[i] = q->coll(c);
        }
      } catch (...) {
        results[i] = caught("weftGroupEnd");
      }
    };
    if (order.size() == 1) {
      const int caller = weft::exec::currentDevice();
      runOne(0);
      weft::exec::useDevice(caller);
    } else if (weft::Status s = onThreads(order.size(), runOne, "weftGroupEnd"); !s) {
      return report(s);
    }
    for (const weft::Status& s : results) {
      if (!s.isOk()) return report(s);
    }
    return weftSuccess;
  } catch (...) {
    return report(caught("weftGroupEnd"));
  }
}

weftResult_t weftCommRegister(weftComm_t comm, void* buff, size_t size, void** handle) {
  if (handle == nullptr) return invalid("weftCommRegister: handle is NULL");
  return withComm(comm, "weftCommRegister", [&](weft::Communicator& c) -> weft::Status {
    auto h = c.registerBuffer(buff, size);
    if (!h) return h.status();
    *handle = *h;
    return {};
  });
}

weftResult_t weftCommDeregister(weftComm_t comm, void* handle) {
  return withComm(comm, "weftCommDeregister",
                  [&](weft::Communicator& c) { return c.deregisterBuffer(handle); });
}

weftResult_t weftHostAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return invalid("weftHostAlloc: ptr is NULL");
  try {
    auto p = weft::transport::hostAlloc(size);
    if (!p) return report(p.status());
    *ptr = *p;
    return weftSuccess;
  } catch (...) {
    return report(caught("weftHostAlloc"));
  }
}

weftResult_t weftHostFree(void* ptr) {
  try {
    return report(weft::transport::hostFree(ptr));
  } catch (...) {
    return report(caught("weftHostFree"));
  }
}

weftResult_t weftBarrier(weftComm_t comm, void* stream) {
  if (weftResult_t r = checkStream(stream, "weftBarrier"); r != weftSuccess) return r;
  return withComm(comm, "weftBarrier", [](weft::Communicator& c) { return c.barrier(); });
}

}  // extern "C"

namespace weft {

Result<Communicator::GpuModel> gpuTunerModelOf(weftComm_t comm) {
  Inside in(find(comm), false);
  if (!in)
    return invalidArgument("comm is not a live communicator (NULL, never created, or destroyed)");
  const std::lock_guard<std::mutex> lock((*in).calls);
  return (*in).impl->gpuTunerModel();
}

Result<Communicator::HostCounters> hostCountersOf(weftComm_t comm) {
  Inside in(find(comm), false);
  if (!in)
    return invalidArgument("comm is not a live communicator (NULL, never created, or destroyed)");
  const std::lock_guard<std::mutex> lock((*in).calls);
  return (*in).impl->hostCounters();
}

}  // namespace weft
