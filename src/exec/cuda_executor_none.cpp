// The CudaExecutor of a build without CUDA: no pointer is a GPU's, and creating one says why.
#include "src/exec/cuda_executor.hpp"

namespace weft::transport {
class CudaIpcTransport {};
}  // namespace weft::transport

namespace weft::exec {

bool cudaBuilt() {
  return false;
}

bool isDevicePointer(const void*) {
  return false;
}

int currentDevice() {
  return -1;
}

void useDevice(int) {}

std::string busIdOf(int) {
  return {};
}

Result<std::unique_ptr<CudaExecutor>> CudaExecutor::create(const GpuOptions&, boot::Bootstrap&) {
  return Status(Code::unsupported, "this build has no CUDA (build with nvcc present)");
}

CudaExecutor::~CudaExecutor() = default;

int CudaExecutor::device() const {
  return -1;
}

int CudaExecutor::threadsOnDevice() const {
  return 0;
}

bool CudaExecutor::someDeviceShared() const {
  return false;
}

std::string CudaExecutor::describe() const {
  return "no CUDA";
}

Status CudaExecutor::begin(void*) {
  return Status(Code::unsupported, "this build has no CUDA");
}

Status CudaExecutor::end(void*) {
  return Status(Code::unsupported, "this build has no CUDA");
}

Result<std::byte*> CudaExecutor::workspace(std::size_t) {
  return Status(Code::unsupported, "this build has no CUDA");
}

Status CudaExecutor::run(const algo::Schedule&, const Geometry&, const Buffers&, algo::Protocol,
                         void*) {
  return Status(Code::unsupported, "this build has no CUDA");
}

Status CudaExecutor::divide(void*, std::size_t, DataType, std::uint64_t, void*) {
  return Status(Code::unsupported, "this build has no CUDA");
}

std::size_t CudaExecutor::oneShotLimit() const {
  return 0;
}

struct CudaExecutor::PeerInputs {};

Result<std::shared_ptr<CudaExecutor::PeerInputs>> CudaExecutor::mapRegistered(const void*,
                                                                              boot::Bootstrap&) {
  return Status(Code::unsupported, "this build has no CUDA");
}

std::vector<std::byte*> CudaExecutor::peerPointers(const PeerInputs&) {
  return {};
}

Status CudaExecutor::direct(const Buffers&, bool, void*, const PeerInputs*, std::size_t,
                            const PeerInputs*, std::size_t) {
  return Status(Code::unsupported, "this build has no CUDA");
}

Status CudaExecutor::directBlocks(const Buffers&, device::DirectKind, void*) {
  return Status(Code::unsupported, "this build has no CUDA");
}

Status CudaExecutor::exchange(const std::vector<P2p>&, void*) {
  return Status(Code::unsupported, "this build has no CUDA");
}

bool CudaExecutor::capturing(void*) {
  return false;
}

Status CudaExecutor::asyncError() const {
  return {};
}

Status CudaExecutor::synchronize() {
  return {};
}

// No LaunchOrder exists without CUDA; CudaExecutor's destructor still names this one.
LaunchOrder::~LaunchOrder() = default;

}  // namespace weft::exec
