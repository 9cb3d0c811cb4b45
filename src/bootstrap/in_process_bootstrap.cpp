// The in-process bootstrap: every rank is a thread of this process, sharing one staging buffer
// under a mutex. A round gathers every rank's record, then lets every rank copy the table out;
// the next round starts only when all have copied.
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "src/bootstrap/bootstrap.hpp"
#include "src/bootstrap/socket.hpp"

namespace weft::boot {
namespace {

struct SharedState {
  SharedState(int n, double timeout) : nranks(n), timeoutSeconds(timeout) {}

  const int nranks;
  const double timeoutSeconds;
  std::mutex mutex;
  std::condition_variable changed;
  // All below guarded by mutex.
  bool copying = false;  // every record is in: ranks are copying the table out
  int arrived = 0;
  int departed = 0;
  std::size_t bytes = 0;
  std::vector<unsigned char> staging;
  std::vector<bool> present;
  std::optional<Status> failure;  // set once; every later call returns it
};

class InProcessBootstrap final : public Bootstrap {
 public:
  InProcessBootstrap(int rank, std::shared_ptr<SharedState> shared)
      : rank_(rank),
        shared_(std::move(shared)),
        prefix_("bootstrap (in-process): rank " + std::to_string(rank) + " of " +
                std::to_string(shared_->nranks) + ": ") {}

  int rank() const override { return rank_; }
  int size() const override { return shared_->nranks; }
  Status allGather(void* buf, std::size_t bytes) override;
  Status barrier() override {
    std::vector<unsigned char> bytes(static_cast<std::size_t>(shared_->nranks), 0);
    return allGather(bytes.data(), 1);
  }
  void abort() override {
    // The other ranks are threads of this process: they fail too, as they would on a peer loss.
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (!shared_->failure) {
      shared_->failure = Status(Code::remoteError, prefix_ + "the bootstrap was aborted");
    }
    shared_->changed.notify_all();
  }

 private:
  // Waits for `ready` under `lock`; false on failure or timeout (which it records).
  template <typename Pred>
  bool waitFor(std::unique_lock<std::mutex>& lock, const Deadline& deadline, const char* what,
               Pred ready);

  const int rank_;
  std::shared_ptr<SharedState> shared_;
  const std::string prefix_;
};

template <typename Pred>
bool InProcessBootstrap::waitFor(std::unique_lock<std::mutex>& lock, const Deadline& deadline,
                                 const char* what, Pred ready) {
  SharedState& s = *shared_;
  const auto done = [&] { return s.failure.has_value() || ready(); };
  if (const auto at = deadline.at()) {
    s.changed.wait_until(lock, *at, done);
  } else {
    s.changed.wait(lock, done);
  }
  // A round every rank arrived at completes even if a rank has failed since (it may be one that
  // left the round with an error of its own to report).
  if (ready()) return true;
  if (s.failure) return false;
  std::string missing;
  for (int r = 0; r < s.nranks; ++r) {
    if (s.copying || s.present[static_cast<std::size_t>(r)]) continue;
    missing += (missing.empty() ? "rank " : ", ") + std::to_string(r);
  }
  s.failure =
      Status(Code::timeout, prefix_ + "timed out after " + deadline.describe() + " " + what +
                                (missing.empty() ? "" : " (missing: " + missing + ")"));
  s.changed.notify_all();
  return false;
}

Status InProcessBootstrap::allGather(void* buf, std::size_t bytes) {
  if (buf == nullptr && bytes > 0) {
    return invalidArgument(prefix_ + "allGather: buf is null with bytes=" + std::to_string(bytes));
  }
  SharedState& s = *shared_;
  const auto n = static_cast<std::size_t>(s.nranks);
  const auto me = static_cast<std::size_t>(rank_);
  auto* base = static_cast<unsigned char*>(buf);
  const Deadline deadline = Deadline::after(s.timeoutSeconds);
  std::unique_lock<std::mutex> lock(s.mutex);
  if (s.failure) return *s.failure;  // broken: every later call fails alike

  // The previous round must be fully copied out before its staging buffer is reused.
  if (!waitFor(lock, deadline, "waiting for the previous allGather to finish",
               [&] { return !s.copying; })) {
    return *s.failure;
  }
  if (s.arrived == 0) {
    s.bytes = bytes;
    s.staging.assign(n * bytes, 0);
    s.present.assign(n, false);
  } else if (bytes != s.bytes) {
    s.failure = Status(Code::invalidUsage,
                       prefix_ + "allGather with " + std::to_string(bytes) +
                           " bytes per rank, but other ranks passed " + std::to_string(s.bytes) +
                           "; every rank must make the same bootstrap calls in the same order");
    s.changed.notify_all();
    return *s.failure;
  }
  if (bytes > 0) std::memcpy(s.staging.data() + me * bytes, base + me * bytes, bytes);
  s.present[me] = true;
  if (++s.arrived == s.nranks) {
    s.copying = true;
    s.changed.notify_all();
  } else if (!waitFor(lock, deadline, "in allGather waiting for the other ranks",
                      [&] { return s.copying; })) {
    return *s.failure;
  }

  if (bytes > 0) std::memcpy(base, s.staging.data(), n * bytes);
  if (++s.departed == s.nranks) {
    s.arrived = 0;
    s.departed = 0;
    s.copying = false;
    s.changed.notify_all();
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<std::unique_ptr<Bootstrap>>> makeInProcess(int nranks,
                                                              const BootstrapOptions& options) {
  if (nranks < 1) {
    return invalidArgument("bootstrap (in-process): nranks is " + std::to_string(nranks) +
                           "; it must be at least 1");
  }
  if (std::isnan(options.timeoutSeconds) || options.timeoutSeconds <= 0) {
    return invalidArgument("bootstrap (in-process): timeoutSeconds is " +
                           std::to_string(options.timeoutSeconds) + "; it must be > 0");
  }
  auto shared = std::make_shared<SharedState>(nranks, options.timeoutSeconds);
  std::vector<std::unique_ptr<Bootstrap>> out;
  out.reserve(static_cast<std::size_t>(nranks));
  for (int r = 0; r < nranks; ++r) out.push_back(std::make_unique<InProcessBootstrap>(r, shared));
  return out;
}

}  // namespace weft::boot
