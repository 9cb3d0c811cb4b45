// Addresses a kernel takes by value (its flags, or the blocks it sums): each rank's own, or a
// peer's on its device.
#pragma once

namespace weft::fused::tp {

template <typename P>
struct DeviceList {
  static constexpr int kMost = 128;
  P at[kMost] = {};
  int count = 0;
};

}  // namespace weft::fused::tp
