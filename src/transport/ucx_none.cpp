// The UCX transport of a build without UCX headers: creating it says how to get it.
#include "src/transport/tcp_lanes.hpp"
#include "src/transport/ucx.hpp"

namespace weft::transport {

struct UcxTransport::Channel {};
class UcxTransport::Link {};

bool ucxAvailable() {
  return false;
}

Result<std::unique_ptr<UcxTransport>> UcxTransport::create(const UcxGeometry&) {
  return Status(Code::unsupported,
                "this build has no UCX transport (configure with UCX headers: Debian libucx-dev)");
}

UcxTransport::~UcxTransport() = default;

Status UcxTransport::connect(const std::vector<std::vector<std::byte>>&, const std::vector<bool>&,
                             const std::vector<bool>&) {
  return {Code::unsupported, "this build has no UCX transport"};
}

void UcxTransport::progress(int) {}

Connection* UcxTransport::to(int, int) const {
  return nullptr;
}

Connection* UcxTransport::from(int, int) const {
  return nullptr;
}

Status UcxTransport::flush(int, const Waiter&) {
  return {};
}

void UcxTransport::notifyAbort(const std::string&) {}

std::string UcxTransport::pollAbort() {
  return {};
}

std::string UcxTransport::awaitAbort(std::chrono::milliseconds) {
  return {};
}

std::string UcxTransport::peerFailure(int) const {
  return {};
}

}  // namespace weft::transport
