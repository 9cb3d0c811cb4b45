#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "weft/status.hpp"
#include "weft/types.hpp"
#include "weft/weft.h"

namespace weft {
namespace {

TEST(Types, SizesMatchTheFormats) {
  EXPECT_EQ(sizeOf(DataType::f64), 8u);
  EXPECT_EQ(sizeOf(DataType::f32), 4u);
  EXPECT_EQ(sizeOf(DataType::f16), 2u);
  EXPECT_EQ(sizeOf(DataType::bf16), 2u);
  EXPECT_EQ(sizeOf(DataType::f8e4m3), 1u);
  EXPECT_EQ(sizeOf(DataType::f8e5m2), 1u);
  EXPECT_EQ(sizeOf(DataType::i8), 1u);
  EXPECT_EQ(sizeOf(DataType::u8), 1u);
  EXPECT_EQ(sizeOf(DataType::i32), 4u);
  EXPECT_EQ(sizeOf(DataType::u32), 4u);
  EXPECT_EQ(sizeOf(DataType::i64), 8u);
  EXPECT_EQ(sizeOf(DataType::u64), 8u);
}

TEST(Types, EveryNameParsesBack) {
  for (DataType t : kAllDataTypes) EXPECT_EQ(parseDataType(name(t)), t) << name(t);
  for (RedOp op : kAllRedOps) EXPECT_EQ(parseRedOp(name(op)), op) << name(op);
  for (Collective c : kAllCollectives) EXPECT_EQ(parseCollective(name(c)), c) << name(c);
}

TEST(Types, ParsersAcceptCommonAliasesAndRejectGarbage) {
  EXPECT_EQ(parseDataType("float"), DataType::f32);
  EXPECT_EQ(parseDataType("HALF"), DataType::f16);
  EXPECT_EQ(parseDataType("bfloat16"), DataType::bf16);
  EXPECT_EQ(parseDataType("int"), DataType::i32);
  EXPECT_EQ(parseCollective("all_reduce"), Collective::allReduce);
  EXPECT_EQ(parseCollective("reduce_scatter"), Collective::reduceScatter);
  EXPECT_FALSE(parseDataType("f128").has_value());
  EXPECT_FALSE(parseRedOp("xor").has_value());
  EXPECT_FALSE(parseCollective("").has_value());
}

TEST(Types, ClassifiesCollectives) {
  EXPECT_TRUE(isReduction(Collective::allReduce));
  EXPECT_TRUE(isReduction(Collective::reduceScatter));
  EXPECT_FALSE(isReduction(Collective::allGather));
  EXPECT_TRUE(hasRoot(Collective::broadcast));
  EXPECT_FALSE(hasRoot(Collective::allToAll));
}

TEST(Status, CarriesCodeAndMessage) {
  const Status ok;
  EXPECT_TRUE(ok.isOk());
  const Status bad = invalidArgument("count overflows");
  EXPECT_FALSE(bad.isOk());
  EXPECT_EQ(bad.code(), Code::invalidArgument);
  EXPECT_EQ(bad.toString(), "invalid argument: count overflows");
  Result<int> r = 7;
  EXPECT_TRUE(r.isOk());
  EXPECT_EQ(*r, 7);
  Result<int> e = unsupported("no");
  EXPECT_FALSE(e.isOk());
  EXPECT_EQ(e.status().code(), Code::unsupported);
}

TEST(CApi, VersionAndErrors) {
  int version = 0;
  ASSERT_EQ(weftGetVersion(&version), weftSuccess);
  EXPECT_EQ(version, WEFT_VERSION_CODE);
  EXPECT_EQ(weftGetVersion(nullptr), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("NULL"), std::string::npos);
  EXPECT_STREQ(weftGetErrorString(weftTimeout), "timeout");
  EXPECT_STREQ(weftGetErrorString(static_cast<weftResult_t>(999)), "unknown result");
  EXPECT_STREQ(weftGetErrorString(static_cast<weftResult_t>(-1)), "unknown result");
  EXPECT_EQ(weftTypeSize(weftBfloat16), 2u);
  EXPECT_EQ(weftTypeSize(static_cast<weftDataType_t>(42)), 0u);
}

}  // namespace
}  // namespace weft
