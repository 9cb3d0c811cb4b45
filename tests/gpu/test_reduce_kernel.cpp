// The device reduce kernel against a host reference, for every dtype and op; skipped without a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "src/device/reduce_kernel.hpp"

namespace weft::device {
namespace {

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The same arithmetic as the kernel, on the host: narrow floats in fp32, rounded on store.
template <typename T>
struct HostCompute {
  using type = T;
};
template <>
struct HostCompute<__half> {
  using type = float;
};
template <>
struct HostCompute<__nv_bfloat16> {
  using type = float;
};
template <>
struct HostCompute<__nv_fp8_e4m3> {
  using type = float;
};
template <>
struct HostCompute<__nv_fp8_e5m2> {
  using type = float;
};

template <typename T>
T hostCombine(T x, T y, RedOp op) {
  using C = typename HostCompute<T>::type;
  const C a = static_cast<C>(x), b = static_cast<C>(y);
  C r{};
  switch (op) {
    case RedOp::sum:
      r = static_cast<C>(a + b);
      break;
    case RedOp::prod:
      r = static_cast<C>(a * b);
      break;
    case RedOp::min:
      r = b < a ? b : a;
      break;
    case RedOp::max:
      r = a < b ? b : a;
      break;
    case RedOp::avg:
      break;
  }
  return static_cast<T>(r);
}

template <typename T>
T randomValue(std::mt19937& rng) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(std::uniform_int_distribution<int>(-100, 100)(rng));
  } else {
    return static_cast<T>(std::uniform_real_distribution<float>(-4.0f, 4.0f)(rng));
  }
}

template <typename T>
void checkType(DataType type) {
  std::mt19937 rng(1234 + static_cast<int>(type));
  // An odd count exercises the scalar tail; offset 1 exercises the unaligned path.
  for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
    const std::size_t count = 1000003;
    std::vector<T> a(count + offset), b(count + offset);
    for (auto& x : a) x = randomValue<T>(rng);
    for (auto& x : b) x = randomValue<T>(rng);
    const std::size_t bytes = (count + offset) * sizeof(T);
    void *da = nullptr, *db = nullptr, *dd = nullptr;
    ASSERT_EQ(cudaMalloc(&da, bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&db, bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dd, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    for (RedOp op : {RedOp::sum, RedOp::prod, RedOp::min, RedOp::max}) {
      ASSERT_EQ(cudaMemset(dd, 0xA5, bytes), cudaSuccess);  // poison
      auto* d = static_cast<T*>(dd) + offset;
      const Status st =
          reduce(d, static_cast<T*>(da) + offset, static_cast<T*>(db) + offset, count, type, op);
      ASSERT_TRUE(st.isOk()) << st.toString();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<T> out(count);
      ASSERT_EQ(cudaMemcpy(out.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const T want = hostCombine(a[i + offset], b[i + offset], op);
        if (std::memcmp(&want, &out[i], sizeof(T)) != 0) ++wrong;
      }
      EXPECT_EQ(wrong, 0u) << name(type) << " " << name(op) << " offset " << offset;
    }
    cudaFree(da);
    cudaFree(db);
    cudaFree(dd);
  }
}

class ReduceKernel : public testing::Test {
 protected:
  void SetUp() override {
    if (!haveGpu()) GTEST_SKIP() << "no GPU";
  }
};

TEST_F(ReduceKernel, Float64) {
  checkType<double>(DataType::f64);
}
TEST_F(ReduceKernel, Float32) {
  checkType<float>(DataType::f32);
}
TEST_F(ReduceKernel, Float16) {
  checkType<__half>(DataType::f16);
}
TEST_F(ReduceKernel, Bfloat16) {
  checkType<__nv_bfloat16>(DataType::bf16);
}
TEST_F(ReduceKernel, Float8e4m3) {
  checkType<__nv_fp8_e4m3>(DataType::f8e4m3);
}
TEST_F(ReduceKernel, Float8e5m2) {
  checkType<__nv_fp8_e5m2>(DataType::f8e5m2);
}
TEST_F(ReduceKernel, Int8) {
  checkType<std::int8_t>(DataType::i8);
}
TEST_F(ReduceKernel, Uint8) {
  checkType<std::uint8_t>(DataType::u8);
}
TEST_F(ReduceKernel, Int32) {
  checkType<std::int32_t>(DataType::i32);
}
TEST_F(ReduceKernel, Uint32) {
  checkType<std::uint32_t>(DataType::u32);
}
TEST_F(ReduceKernel, Int64) {
  checkType<std::int64_t>(DataType::i64);
}
TEST_F(ReduceKernel, Uint64) {
  checkType<std::uint64_t>(DataType::u64);
}

TEST_F(ReduceKernel, RejectsAvgAndNullBuffers) {
  EXPECT_EQ(reduce(nullptr, nullptr, nullptr, 4, DataType::f32, RedOp::sum).code(),
            Code::invalidArgument);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  EXPECT_EQ(reduce(p, p, p, 4, DataType::f32, RedOp::avg).code(), Code::invalidArgument);
  EXPECT_TRUE(reduce(p, p, p, 0, DataType::f32, RedOp::sum).isOk());
  cudaFree(p);
}

}  // namespace
}  // namespace weft::device
