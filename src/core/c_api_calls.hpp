// What the C ABI's entry points share (src/core/c_api.cpp, and fused/'s entry points compiled
// into libweft): live handles, the last error, groups, and how a collective is run or queued.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "src/core/communicator.hpp"
#include "src/core/log.hpp"
#include "src/exec/cuda_executor.hpp"
#include "weft/status.hpp"
#include "weft/types.hpp"
#include "weft/weft.h"

struct weftComm {
  std::unique_ptr<weft::Communicator> impl;  // null once destroyed
  std::string summary;
  // Held by every call that uses the communicator's state (collectives, point-to-point, groups,
  // split, registration, plans): calls from several host threads run one at a time, each whole,
  // in the order the threads take it. Abort, the queries and the async error take no lock.
  std::mutex calls;
  // The calls inside the communicator now; weftCommDestroy waits for none before freeing it.
  std::mutex state;
  std::condition_variable idle;
  int inflight = 0;
  bool destroying = false;  // a destroy waits: no new call but abort and the queries starts
};

namespace weft::capi {

inline thread_local std::string gLastError;  // per-thread, like errno: no locking, no sharing

// The communicators alive now, so a destroyed or bogus handle is an error, not a crash; a call
// holds its communicator's shared_ptr, so a destroy racing it never frees what it uses. This and
// the algorithm registry are weft's only global state.
inline std::mutex gLiveMutex;
inline std::map<const weftComm*, std::shared_ptr<weftComm>> gLive;

inline std::shared_ptr<weftComm> find(const weftComm* c) {
  std::lock_guard<std::mutex> lock(gLiveMutex);
  auto it = gLive.find(c);
  return it == gLive.end() ? nullptr : it->second;
}

// One call inside a communicator: counted while it runs (weftCommDestroy waits for the count to
// reach zero), refused once the communicator is gone or, unless `duringDestroy` (abort and the
// queries, which never block), once a destroy has begun.
class Inside {
 public:
  Inside(std::shared_ptr<weftComm> c, bool duringDestroy) : c_(std::move(c)) {
    if (!c_) return;
    std::lock_guard<std::mutex> lock(c_->state);
    if (!c_->impl || (c_->destroying && !duringDestroy)) return;
    ++c_->inflight;
    in_ = true;
  }
  ~Inside() {
    if (!in_) return;
    std::lock_guard<std::mutex> lock(c_->state);
    if (--c_->inflight == 0) c_->idle.notify_all();
  }
  Inside(const Inside&) = delete;
  Inside& operator=(const Inside&) = delete;
  explicit operator bool() const { return in_; }
  weftComm& operator*() const { return *c_; }

 private:
  std::shared_ptr<weftComm> c_;
  bool in_ = false;
};

// A failed call: its reason kept for weftGetLastError and printed at WARN where it happens.
inline weftResult_t fail(weftResult_t code, std::string message) {
  WEFT_WARN(weft::log::kAll, "%s", message.c_str());
  gLastError = std::move(message);
  return code;
}

inline weftResult_t report(const weft::Status& s) {
  if (s.isOk()) return weftSuccess;
  return fail(static_cast<weftResult_t>(s.code()), s.message());
}

inline weftResult_t invalid(std::string message) {
  return fail(weftInvalidArgument, std::move(message));
}

// What an exception escaping weft becomes: a failed thread start or allocation a system error
// (the process is out of threads, address space or memory), anything else an internal error.
inline weft::Status caught(const char* what) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return {weft::Code::systemError, std::string(what) + ": out of memory"};
  } catch (const std::system_error& e) {
    return {weft::Code::systemError, std::string(what) + ": " + e.what()};
  } catch (const std::exception& e) {
    return {weft::Code::internalError, std::string(what) + ": " + e.what()};
  } catch (...) {
    return {weft::Code::internalError, std::string(what) + ": an unknown exception"};
  }
}

inline weftResult_t notLive(const char* what) {
  return invalid(std::string(what) +
                 ": comm is not a live communicator (NULL, never created, or destroyed)");
}

// Runs `fn` on a live communicator, one call at a time (weftComm::calls) unless `serialized` is
// false (abort and the queries: they run even while a destroy waits); unknown handles and
// exceptions become errors.
template <typename Fn>
weftResult_t withComm(weftComm_t comm, const char* what, Fn&& fn, bool serialized = true) {
  try {
    Inside in(find(comm), !serialized);
    if (!in) return notLive(what);
    const weft::log::RankScope rank((*in).impl->rank());
    std::unique_lock<std::mutex> lock((*in).calls, std::defer_lock);
    if (serialized) lock.lock();
    return report(fn(*(*in).impl));
  } catch (...) {
    return report(caught(what));
  }
}

// The calls queued since the outermost weftGroupStart on this thread.
struct Queued {
  weftComm* comm;
  std::optional<weft::Communicator::P2pOp> p2p;           // a send or receive, or
  std::function<weft::Status(weft::Communicator&)> coll;  // a collective
  // The caller's CUDA device when it queued the call (-1: none): weftGroupEnd runs each
  // communicator's part on a thread of its own, with that device current, as one thread
  // driving ranks on several GPUs sets each rank's device before its calls.
  int device = -1;
};
inline thread_local int gGroupDepth = 0;
inline thread_local std::vector<Queued> gGroup;

// A collective: run now, or, when a group is open, queued once `check` (its arguments, as the
// call itself checks them) passed.
template <typename Check, typename Fn>
weftResult_t collective(weftComm_t comm, const char* what, Check check, Fn fn) {
  if (gGroupDepth > 0) {
    try {
      Inside in(find(comm), false);
      if (!in) return notLive(what);
      if (weft::Status s = check(static_cast<const weft::Communicator&>(*(*in).impl)); !s)
        return report(s);
      gGroup.push_back({comm, std::nullopt, std::function<weft::Status(weft::Communicator&)>(fn),
                        weft::exec::currentDevice()});
    } catch (...) {
      return report(caught(what));
    }
    return weftSuccess;
  }
  return withComm(comm, what, fn);
}

// The check of a collective with plain buffers (not all-to-all-v).
inline auto checked(weft::Collective coll, const void* send, const void* recv, size_t count,
                    weftDataType_t type, int root) {
  return [=](const weft::Communicator& c) {
    return c.check(coll, send, recv, count, static_cast<weft::DataType>(type), root);
  };
}

inline weftResult_t checkStream(void* stream, const char* what) {
  if (stream != nullptr)
    return fail(weftInvalidUsage,
                std::string(what) + ": stream must be NULL (it runs on the host)");
  return weftSuccess;
}

inline bool validType(weftDataType_t t) {
  return static_cast<int>(t) >= 0 && t < weftNumDataTypes;
}
inline bool validOp(weftRedOp_t op) {
  return static_cast<int>(op) >= 0 && op < weftNumRedOps;
}

// Type and op, checked before the communicator is touched (the communicator checks the stream
// against the buffers).
inline weftResult_t checkArgs(const char* what, weftDataType_t type, weftRedOp_t op, void*) {
  if (!validType(type))
    return invalid(std::string(what) + ": invalid datatype " +
                   std::to_string(static_cast<int>(type)));
  if (!validOp(op))
    return invalid(std::string(what) + ": invalid op " + std::to_string(static_cast<int>(op)));
  return weftSuccess;
}

}  // namespace weft::capi
