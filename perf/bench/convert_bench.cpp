// Throughput of the narrow-float conversions (src/exec/numeric.hpp) that the host reduction runs
// on every f16, bf16 and fp8 element: float to each format and back, over arrays of 4 Ki elements
// (cache-resident: the conversion's own cost) and 1 Mi elements.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fused/fp8/codec.hpp"
#include "perf/bench/benchmarks.hpp"
#include "src/exec/numeric.hpp"

namespace weft::bench {
namespace {

// Floats of both signs with full mantissas and magnitudes in [2^-6, 2^8): inside every format's
// normal range (e4m3's is [2^-6, 448]), so most round and none take the subnormal, saturating
// or NaN paths.
std::vector<float> samples(std::size_t n) {
  std::vector<float> out(n);
  std::uint32_t x = 2463534242u;
  for (float& v : out) {
    x ^= x << 13;  // xorshift32
    x ^= x >> 17;
    x ^= x << 5;
    const float mantissa = 1.0f + static_cast<float>(x >> 9) / 8388608.0f;  // [1, 2)
    const int exponent = static_cast<int>(x % 14) - 6;
    v = std::ldexp((x & 0x100u) != 0 ? -mantissa : mantissa, exponent);
  }
  return out;
}

constexpr float asIs(float f) {
  return f;
}

// out[i] = Convert(in[i]) for an array whose inputs are Make(samples).
template <typename From, typename To, From (*Make)(float), To (*Convert)(From)>
void convertBenchmark(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  std::vector<From> in;
  in.reserve(count);
  for (float v : samples(count)) in.push_back(Make(v));
  std::vector<To> out(count);
  for (auto _ : state) {
    for (std::size_t i = 0; i < count; ++i) out[i] = Convert(in[i]);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(count));
}

// convert/f32_to_<format> and convert/<format>_to_f32.
template <typename Narrow, Narrow (*Encode)(float), float (*Decode)(Narrow)>
void registerFormat(const std::string& format) {
  const std::string encode = "convert/f32_to_" + format;
  const std::string decode = "convert/" + format + "_to_f32";
  benchmark::RegisterBenchmark(encode.c_str(), convertBenchmark<float, Narrow, asIs, Encode>)
      ->ArgName("count")
      ->Arg(4 << 10)
      ->Arg(1 << 20);
  benchmark::RegisterBenchmark(decode.c_str(), convertBenchmark<Narrow, float, Encode, Decode>)
      ->ArgName("count")
      ->Arg(4 << 10)
      ->Arg(1 << 20);
}

// codec/<encode|decode>/<scheme>: the host fp8 codec (fused/fp8/codec.hpp) on bf16 values,
// bytes read plus written, as the device codec's benchmark counts them.
void codecBenchmark(benchmark::State& state, const std::string& scheme, bool decode) {
  const auto count = static_cast<std::size_t>(state.range(0));
  const auto codec = fused::fp8::Codec::parse(scheme);
  std::vector<std::uint16_t> values;
  values.reserve(count);
  for (float v : samples(count)) values.push_back(exec::floatToBf16(v));
  std::vector<std::byte> encoded(codec->encodedBytes(count));
  if (!fused::fp8::encode(*codec, DataType::bf16, values.data(), count, encoded.data()).isOk())
    state.SkipWithError("encode failed");
  for (auto _ : state) {
    if (decode) {
      (void)fused::fp8::decode(*codec, DataType::bf16, encoded.data(), count, values.data());
    } else {
      (void)fused::fp8::encode(*codec, DataType::bf16, values.data(), count, encoded.data());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() *
                          static_cast<std::int64_t>(count * 2 + encoded.size()));
}

}  // namespace

void registerConvertBenchmarks() {
  for (const char* scheme : {"e4m3:32", "e4m3:128"}) {
    for (bool decode : {false, true}) {
      const std::string name =
          std::string("codec/") + (decode ? "decode/" : "encode/") + scheme + "/bf16";
      benchmark::RegisterBenchmark(name.c_str(), codecBenchmark, std::string(scheme), decode)
          ->ArgName("count")
          ->Arg(1 << 20)
          ->Arg(16 << 20);
    }
  }
  registerFormat<std::uint16_t, exec::floatToHalf, exec::halfToFloat>("f16");
  registerFormat<std::uint16_t, exec::floatToBf16, exec::bf16ToFloat>("bf16");
  registerFormat<std::uint8_t, exec::floatToE4m3, exec::e4m3ToFloat>("f8e4m3");
  registerFormat<std::uint8_t, exec::floatToE5m2, exec::e5m2ToFloat>("f8e5m2");
}

}  // namespace weft::bench
