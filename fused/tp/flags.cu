#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "fused/tp/flags.hpp"

namespace weft::fused::tp {
namespace {

__device__ std::uint64_t now() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void emptyKernel() {}

// A wait past its timeout: says which flag and what it held (the log of a stuck peer), then traps.
__device__ void timedOut(int j, int count, const std::uint64_t* flag, std::uint64_t have,
                         std::uint64_t want) {
  printf("weft: tensor-parallel flag wait timed out: flag %d of %d (%p) holds %llu, wants %llu\n",
         j, count, static_cast<const void*>(flag), static_cast<unsigned long long>(have),
         static_cast<unsigned long long>(want));
  __trap();
}

__global__ void countKernel(std::uint64_t* epoch) {
  *epoch += 1;
  __threadfence_system();
}

__global__ void raiseKernel(std::uint64_t* flag, const std::uint64_t* epoch, std::uint64_t scale,
                            std::uint64_t plus) {
  // What the stream did before (the copies this flag announces) is complete: this kernel ran
  // after it; the fence orders the store after everything this device wrote.
  __threadfence_system();
  *reinterpret_cast<volatile std::uint64_t*>(flag) = *epoch * scale + plus;
  __threadfence_system();
}

__global__ void raiseEachKernel(const FlagList flags, const std::uint64_t* epoch) {
  __threadfence_system();
  const std::uint64_t value = *epoch;
  for (int j = 0; j < flags.count; ++j)
    *reinterpret_cast<volatile std::uint64_t*>(flags.at[j]) = value;
  __threadfence_system();
}

__global__ void awaitEachKernel(const FlagList flags, const std::uint64_t* epoch,
                                std::uint64_t scale, std::uint64_t plus, std::uint64_t timeoutNs) {
  const std::uint64_t want = *epoch * scale + plus, start = now();
  for (int j = 0; j < flags.count; ++j) {
    const auto* flag = reinterpret_cast<const volatile std::uint64_t*>(flags.at[j]);
    while (*flag < want) {
      if (now() - start > timeoutNs) timedOut(j, flags.count, flags.at[j], *flag, want);
      __nanosleep(200);
    }
  }
  __threadfence_system();
}

__global__ void awaitKernel(const std::uint64_t* first, std::size_t stride, int count, int skip,
                            const std::uint64_t* epoch, std::int64_t delta,
                            std::uint64_t timeoutNs) {
  const auto want = static_cast<std::uint64_t>(static_cast<std::int64_t>(*epoch) + delta);
  const std::uint64_t start = now();
  for (int j = 0; j < count; ++j) {
    if (j == skip) continue;
    const auto* flag = reinterpret_cast<const volatile std::uint64_t*>(
        reinterpret_cast<const char*>(first) + j * stride);
    while (*flag < want) {
      if (now() - start > timeoutNs)
        timedOut(j, count, const_cast<const std::uint64_t*>(flag), *flag, want);
      __nanosleep(200);
    }
  }
  __threadfence_system();
}

Status launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return Status(Code::systemError,
                std::string("tensor-parallel ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

Status settle(void* stream) {
  emptyKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>();
  return launched("settle");
}

Status countCall(std::uint64_t* epoch, void* stream) {
  countKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(epoch);
  return launched("call count");
}

Status raiseFlag(std::uint64_t* flag, const std::uint64_t* epoch, void* stream, std::uint64_t scale,
                 std::uint64_t plus) {
  raiseKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(flag, epoch, scale, plus);
  return launched("flag");
}

Status awaitEach(const FlagList& flags, const std::uint64_t* epoch, std::uint64_t scale,
                 std::uint64_t plus, std::uint64_t timeoutNs, void* stream) {
  awaitEachKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(flags, epoch, scale, plus,
                                                                  timeoutNs);
  return launched("wait");
}

Status raiseEach(const FlagList& flags, const std::uint64_t* epoch, void* stream) {
  raiseEachKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(flags, epoch);
  return launched("flags");
}

Status awaitFlags(const std::uint64_t* first, std::size_t strideBytes, int count, int skip,
                  const std::uint64_t* epoch, std::int64_t delta, std::uint64_t timeoutNs,
                  void* stream) {
  awaitKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(first, strideBytes, count, skip,
                                                              epoch, delta, timeoutNs);
  return launched("wait");
}

Status loadFlagKernels(std::uint64_t* words, void* stream) {
  auto* st = static_cast<cudaStream_t>(stream);
  auto failed = [](cudaError_t e) {
    return Status(Code::systemError,
                  std::string("tensor-parallel flags: ") + cudaGetErrorString(e));
  };
  if (cudaError_t e = cudaMemsetAsync(words, 0, 2 * sizeof(std::uint64_t), st); e != cudaSuccess)
    return failed(e);
  if (Status s = settle(stream); !s) return s;
  if (Status s = countCall(words, stream); !s) return s;
  if (Status s = raiseFlag(words + 1, words, stream); !s) return s;
  if (Status s = awaitFlags(words + 1, 0, 1, -1, words, 0, 1000000000, stream); !s) return s;
  FlagList one;
  one.at[one.count++] = words + 1;
  if (Status s = awaitEach(one, words, 1, 0, 1000000000, stream); !s) return s;
  if (Status s = raiseEach(one, words, stream); !s) return s;
  if (cudaError_t e = cudaStreamSynchronize(st); e != cudaSuccess) return failed(e);
  return {};
}

}  // namespace weft::fused::tp
