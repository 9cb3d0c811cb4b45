#include "algorithms/compression.hpp"

namespace weft {
namespace {

constexpr std::string_view kForms =
    "expected none or FORMAT:BLOCK[:always], FORMAT fp8e4m3 or fp8e5m2, BLOCK 32 (E8M0 scales) "
    "or 128 (f32 scales), e.g. fp8e4m3:32";

std::string_view next(std::string_view& rest) {
  const auto colon = rest.find(':');
  const std::string_view part = rest.substr(0, colon);
  rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
  return part;
}

}  // namespace

Result<weftCompression> parseCompression(std::string_view text) {
  weftCompression c{weftCompressNone, weftScaleE8M0, 0, 0};
  if (text.empty() || text == "none") return c;
  const std::string bad = std::string(text) + ": " + std::string(kForms);
  std::string_view rest = text;
  std::string_view format = next(rest);
  if (format.substr(0, 3) == "fp8") format.remove_prefix(3);
  if (format == "e4m3") {
    c.format = weftCompressFp8E4M3;
  } else if (format == "e5m2") {
    c.format = weftCompressFp8E5M2;
  } else {
    return invalidArgument(bad);
  }
  const std::string_view block = next(rest);
  if (block == "32") {
    c.block = 32;
  } else if (block == "128") {
    c.block = 128;
    c.scale = weftScaleF32;
  } else {
    return invalidArgument(bad);
  }
  if (!rest.empty()) {
    if (rest != "always") return invalidArgument(bad);
    c.always = 1;
  }
  return c;
}

Status checkCompression(const weftCompression& c, std::string_view what) {
  const std::string w(what);
  if (static_cast<int>(c.format) < 0 || c.format >= weftNumCompressFormats)
    return invalidArgument(w + ": unknown compression format " +
                           std::to_string(static_cast<int>(c.format)));
  if (!compresses(c)) return {};
  if (static_cast<int>(c.scale) < 0 || c.scale >= weftNumScaleKinds)
    return invalidArgument(w + ": unknown scale kind " + std::to_string(static_cast<int>(c.scale)));
  const bool e8m0 = c.scale == weftScaleE8M0;
  if (c.block != (e8m0 ? 32 : 128))
    return invalidArgument(w + ": a block of " + std::to_string(c.block) + " with " +
                           (e8m0 ? "E8M0" : "f32") +
                           " scales is not supported (E8M0 scales take blocks of 32, f32 scales "
                           "blocks of 128)");
  if (c.always != 0 && c.always != 1)
    return invalidArgument(w + ": always must be 0 or 1, not " + std::to_string(c.always));
  return {};
}

std::string compressionName(const weftCompression& c) {
  if (!compresses(c)) return "none";
  return std::string(c.format == weftCompressFp8E4M3 ? "e4m3:" : "e5m2:") +
         std::to_string(c.block) + (c.always ? ":always" : "");
}

Status compressible(Collective coll, DataType type, RedOp op, std::string_view what) {
  const std::string w(what);
  if (coll != Collective::allReduce && coll != Collective::reduceScatter &&
      coll != Collective::allGather)
    return invalidArgument(w + ": " + std::string(name(coll)) + " cannot be compressed");
  if (type != DataType::bf16 && type != DataType::f16 && type != DataType::f32)
    return invalidArgument(w + ": " + std::string(name(type)) +
                           " cannot be compressed (bf16, f16 and f32 can)");
  if (coll != Collective::allGather && op != RedOp::sum && op != RedOp::avg)
    return invalidArgument(w + ": " + std::string(name(op)) +
                           " cannot be compressed (sum and avg can: scaled blocks cannot be "
                           "multiplied or compared exactly)");
  return {};
}

algo::CodecShape codecShapeOf(const weftCompression& c, DataType type) {
  algo::CodecShape s;
  s.name = compressionName({c.format, c.scale, c.block, 0});  // without ":always"
  s.block = static_cast<std::size_t>(c.block);
  s.scaleBytes = c.scale == weftScaleE8M0 ? 1 : 4;
  s.valueBytes = sizeOf(type);
  return s;
}

}  // namespace weft
