// The root of a rendezvous: a detached thread that collects every rank's listening address and
// hands each rank the full table. It serves exactly one rendezvous, then exits: on success, on
// a usage error (after telling every rank it can), or when no rank has arrived for the timeout.
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "src/bootstrap/rendezvous.hpp"
#include "src/core/log.hpp"

namespace weft::boot::detail {
namespace {

// Replies on a failure are small; never let a rank that stopped reading hold the root for long.
constexpr double kErrorReplySeconds = 1.0;

class Root {
 public:
  Root(Socket listener, const Secret& secret, double timeoutSeconds)
      : listener_(std::move(listener), secret), timeoutSeconds_(timeoutSeconds) {}

  void run();

 private:
  // The next hello, or the error that ended the wait (a timeout: none within timeoutSeconds_).
  // Says at WARN who is missing every log::progressSeconds of the wait.
  Result<HelloListener::Arrival> nextArrival();
  // Returns the problem with this hello, if any.
  Status check(const Hello& hello) const;
  // Records the failure and tells every rank connected so far.
  void fail(Status problem);
  void tell(const Socket& socket, const Handshake& handshake, int rank);
  bool everyoneTold() const { return toldCount_ == nranks_; }
  std::string missingRanks() const;

  HelloListener listener_;
  double timeoutSeconds_;
  int nranks_ = 0;  // from the first rank to arrive
  int firstRank_ = -1;
  int arrived_ = 0;
  std::vector<Socket> members_;        // by rank
  std::vector<Handshake> handshakes_;  // by rank: their connections' handshakes
  std::vector<SocketAddress> table_;
  std::optional<Status> failure_;
  std::vector<bool> told_;
  int toldCount_ = 0;
};

void Root::run() {
  for (;;) {
    // The timeout counts from the last arrival: ranks may start at different times.
    auto arrival = nextArrival();
    if (!arrival) {
      if (failure_ || nranks_ == 0) return;  // told whoever came, or nobody came
      const Deadline spent = Deadline::after(timeoutSeconds_);
      if (arrival.status().code() == Code::timeout) {
        fail(Status(Code::timeout, "only " + std::to_string(arrived_) + " of " +
                                       std::to_string(nranks_) +
                                       " ranks joined the rendezvous, and no more within " +
                                       spent.describe() + "; missing: " + missingRanks() +
                                       " (every rank must call init with the same id and nranks)"));
      } else {
        fail(Status(Code::systemError, "the bootstrap root failed: " + arrival.status().message()));
      }
      return;
    }
    const Hello& hello = arrival->hello;
    if (hello.kind != HelloKind::toRoot) continue;  // not for the root; the socket closes
    if (failure_) {
      tell(arrival->socket, arrival->handshake, hello.rank);
      if (everyoneTold()) return;
      continue;
    }
    if (nranks_ == 0 && hello.nranks >= 1) {
      nranks_ = hello.nranks;
      firstRank_ = hello.rank;
      members_.resize(static_cast<std::size_t>(nranks_));
      handshakes_.resize(static_cast<std::size_t>(nranks_));
      table_.resize(static_cast<std::size_t>(nranks_));
      told_.assign(static_cast<std::size_t>(nranks_), false);
    }
    if (Status problem = check(hello); !problem.isOk()) {
      fail(std::move(problem));
      tell(arrival->socket, arrival->handshake, hello.rank);
      if (everyoneTold()) return;
      continue;  // keep answering late ranks with the error until all know or none come
    }
    members_[static_cast<std::size_t>(hello.rank)] = std::move(arrival->socket);
    handshakes_[static_cast<std::size_t>(hello.rank)] = arrival->handshake;
    table_[static_cast<std::size_t>(hello.rank)] = hello.address;
    if (++arrived_ < nranks_) continue;

    const Deadline deadline = Deadline::after(timeoutSeconds_);
    for (std::size_t r = 0; r < members_.size(); ++r) {
      // A rank that vanished now finds out when its ring neighbours cannot reach it.
      const std::vector<unsigned char> reply = encodeReply(handshakes_[r], Status::ok(), table_);
      (void)members_[r].sendAll(reply.data(), reply.size(), "rank " + std::to_string(r), deadline,
                                nullptr);
    }
    return;
  }
}

Result<HelloListener::Arrival> Root::nextArrival() {
  const Deadline deadline = Deadline::after(timeoutSeconds_);
  const double every = log::progressSeconds(timeoutSeconds_);
  for (;;) {
    const double left = deadline.secondsLeft();
    auto arrival = listener_.next(Deadline::after(std::min(every, left)), nullptr);
    if (arrival || arrival.status().code() != Code::timeout || deadline.expired()) return arrival;
    if (nranks_ > 0 && !failure_) {
      WEFT_WARN(log::kBootstrap,
                "bootstrap root: %d of %d ranks have joined; waiting for %s (%.0f s left)",
                arrived_, nranks_, missingRanks().c_str(), deadline.secondsLeft());
    }
  }
}

Status Root::check(const Hello& hello) const {
  const std::string who = "rank " + std::to_string(hello.rank);
  if (hello.nranks != nranks_) {
    return {Code::invalidUsage, who + " joined with nranks=" + std::to_string(hello.nranks) +
                                    ", but rank " + std::to_string(firstRank_) +
                                    " joined with nranks=" + std::to_string(nranks_) +
                                    "; every rank must pass the same nranks"};
  }
  if (hello.rank < 0 || hello.rank >= nranks_) {
    return {Code::invalidUsage, who + " is out of range for nranks=" + std::to_string(nranks_)};
  }
  if (members_[static_cast<std::size_t>(hello.rank)].valid()) {
    return {Code::invalidUsage,
            who +
                " joined twice (two processes passed the same rank, or one id was used for "
                "two communicators)"};
  }
  if (!hello.address.valid() || hello.address.port() == 0) {
    return {Code::invalidUsage, who + " sent no listening address"};
  }
  return Status::ok();
}

void Root::fail(Status problem) {
  failure_ = std::move(problem);
  for (std::size_t r = 0; r < members_.size(); ++r) {
    if (members_[r].valid()) tell(members_[r], handshakes_[r], static_cast<int>(r));
  }
  members_.clear();  // closes them
}

void Root::tell(const Socket& socket, const Handshake& handshake, int rank) {
  const std::vector<unsigned char> reply = encodeReply(handshake, *failure_, {});
  (void)socket.sendAll(reply.data(), reply.size(), "rank " + std::to_string(rank),
                       Deadline::after(kErrorReplySeconds), nullptr);
  if (rank >= 0 && rank < nranks_ && !told_[static_cast<std::size_t>(rank)]) {
    told_[static_cast<std::size_t>(rank)] = true;
    ++toldCount_;
  }
}

std::string Root::missingRanks() const {
  std::string out;
  int listed = 0;
  for (std::size_t r = 0; r < members_.size(); ++r) {
    if (members_[r].valid()) continue;
    if (++listed > 16) {
      out += ", ...";
      break;
    }
    out += (out.empty() ? "rank " : ", ") + std::to_string(r);
  }
  return out;
}

// The listening sockets of the roots alive in this process. A child forked meanwhile has no root
// thread, so its copies would only keep the port open (a stranger's connection queued there and
// never answered) and hold a descriptor per id: the child closes them as it starts.
// Never destroyed: a detached root thread may still untrack its descriptor while the process
// exits and runs static destructors.
std::mutex& rootsMutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::set<int>& rootFds() {
  static auto* fds = new std::set<int>;
  return *fds;
}
std::condition_variable& rootsDone() {
  static auto* cv = new std::condition_variable;
  return *cv;
}

void watchForks() {
  static std::once_flag once;
  std::call_once(once, [] {
    (void)pthread_atfork([] { rootsMutex().lock(); }, [] { rootsMutex().unlock(); },
                         [] {
                           for (int fd : rootFds()) ::close(fd);
                           rootFds().clear();
                           rootsMutex().unlock();
                         });
  });
}

void track(int fd, bool alive) {
  std::lock_guard<std::mutex> lock(rootsMutex());
  if (alive) {
    rootFds().insert(fd);
  } else {
    rootFds().erase(fd);
    rootsDone().notify_all();
  }
}

}  // namespace

bool waitForRoots(double seconds) {
  std::unique_lock<std::mutex> lock(rootsMutex());
  if (rootFds().empty()) return true;
  WEFT_WARN(log::kBootstrap,
            "bootstrap: this process runs the rendezvous' root; waiting up to %.0f s for the "
            "ranks still to come to hear why it failed",
            seconds);
  return rootsDone().wait_for(lock, std::chrono::duration<double>(seconds),
                              [] { return rootFds().empty(); });
}

Status startRootThread(Socket listener, const Secret& secret, double timeoutSeconds) {
  const int fd = listener.fd();
  try {
    watchForks();
    track(fd, true);
    auto root = std::make_unique<Root>(std::move(listener), secret, timeoutSeconds);
    std::thread([root = std::move(root), fd]() mutable {
      try {
        root->run();
      } catch (...) {
        // Only allocation can throw here; the ranks then time out with their own message.
      }
      track(fd, false);
      root.reset();  // close every descriptor before the thread ends
    }).detach();
  } catch (const std::exception& e) {
    track(fd, false);
    return {Code::systemError,
            std::string("could not start the bootstrap root thread: ") + e.what()};
  }
  return Status::ok();
}

}  // namespace weft::boot::detail
