// A test-only stand-in for libcuda.so.1 describing the same eight GPUs as fake_nvml.cpp, numbered
// in reverse (CUDA's order need not be NVML's), with peer access only within each half {0-3},
// {4-7} of the NVML numbering and native atomics only within pairs. Exports just what weft's
// discovery calls, with the driver API's C signatures.
#include <cstdio>

extern "C" {

using CUresult = int;
using CUdevice = int;

static const unsigned kGpuBus[8] = {0x18, 0x1c, 0x58, 0x5c, 0x98, 0x9c, 0xd8, 0xdc};
static bool gInit = false;

static int nvmlIndex(CUdevice d) {
  return 7 - d;
}

CUresult cuInit(unsigned flags) {
  gInit = flags == 0;
  return gInit ? 0 : 1;
}
CUresult cuDeviceGetCount(int* n) {
  *n = 8;
  return gInit ? 0 : 3;
}
CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal < 0 || ordinal >= 8) return 101;  // CUDA_ERROR_INVALID_DEVICE
  *d = ordinal;
  return 0;
}
CUresult cuDeviceGetPCIBusId(char* out, int len, CUdevice d) {
  std::snprintf(out, static_cast<std::size_t>(len), "0000:%02X:00.0", kGpuBus[nvmlIndex(d)]);
  return 0;
}
CUresult cuDeviceGetP2PAttribute(int* value, int attribute, CUdevice a, CUdevice b) {
  const int x = nvmlIndex(a), y = nvmlIndex(b);
  switch (attribute) {
    case 1:  // performance rank
      *value = x / 2 == y / 2 ? 0 : 1;
      return 0;
    case 2:  // access supported
      *value = x / 4 == y / 4 ? 1 : 0;
      return 0;
    case 3:  // native atomics
      *value = x / 2 == y / 2 ? 1 : 0;
      return 0;
    default:
      return 1;  // CUDA_ERROR_INVALID_VALUE
  }
}

}  // extern "C"
