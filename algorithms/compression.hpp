// weft.h's weftCompression: parsed from its text form (WEFT_COMPRESS, weftCompressionParse,
// weft-plan tune --compress), checked, named, and shaped for the selector's pricing
// (algo::CodecShape); what a codec does with it is fused/fp8's.
#pragma once

#include <string>
#include <string_view>

#include "algorithms/selector.hpp"
#include "weft/status.hpp"
#include "weft/types.hpp"
#include "weft/weft.h"

namespace weft {

inline bool compresses(const weftCompression& c) {
  return c.format != weftCompressNone;
}
// "fp8e4m3:32", "e5m2:128" (the fp8 prefix optional), either with ":always"; "none" or "".
Result<weftCompression> parseCompression(std::string_view text);
// A compression weft runs: a known format with E8M0 scales over 32 values or f32 over 128.
Status checkCompression(const weftCompression& c, std::string_view what);
// "e4m3:32", "e5m2:128:always", "none".
std::string compressionName(const weftCompression& c);
// Whether a compression serves a call: all-reduce, reduce-scatter or all-gather of bf16, f16
// or f32, summed or averaged.
Status compressible(Collective coll, DataType type, RedOp op, std::string_view what);
// What the selector prices a call of `type` through `c` with (c compresses).
algo::CodecShape codecShapeOf(const weftCompression& c, DataType type);

}  // namespace weft
