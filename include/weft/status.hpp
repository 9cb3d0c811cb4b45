// Errors as values: Status and Result<T>. Codes are the C ABI's weftResult_t.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "weft/types.h"

namespace weft {

enum class Code : int {
  ok = weftSuccess,
  invalidArgument = weftInvalidArgument,
  invalidUsage = weftInvalidUsage,
  systemError = weftSystemError,
  internalError = weftInternalError,
  remoteError = weftRemoteError,
  timeout = weftTimeout,
  unsupported = weftUnsupported,
  inProgress = weftInProgress,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool isOk() const { return code_ == Code::ok; }
  explicit operator bool() const { return isOk(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>"
  std::string toString() const;

 private:
  Code code_ = Code::ok;
  std::string message_;
};

inline Status invalidArgument(std::string m) {
  return {Code::invalidArgument, std::move(m)};
}
inline Status unsupported(std::string m) {
  return {Code::unsupported, std::move(m)};
}
inline Status internalError(std::string m) {
  return {Code::internalError, std::move(m)};
}

// A value or the Status that explains its absence.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status s) : status_(std::move(s)) { assert(!status_.isOk()); }  // NOLINT

  bool isOk() const { return value_.has_value(); }
  explicit operator bool() const { return isOk(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

inline std::string_view name(Code c) {
  switch (c) {
    case Code::ok:
      return "success";
    case Code::invalidArgument:
      return "invalid argument";
    case Code::invalidUsage:
      return "invalid usage";
    case Code::systemError:
      return "system error";
    case Code::internalError:
      return "internal error";
    case Code::remoteError:
      return "remote error";
    case Code::timeout:
      return "timeout";
    case Code::unsupported:
      return "unsupported";
    case Code::inProgress:
      return "in progress";
  }
  return "unknown result";
}

inline std::string Status::toString() const {
  std::string out(name(code_));
  if (!message_.empty()) out += ": " + message_;
  return out;
}

}  // namespace weft
