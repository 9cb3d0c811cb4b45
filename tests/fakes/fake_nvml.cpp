// A test-only stand-in for libnvidia-ml.so: an 8-GPU HGX H100 (sm90) whose GPUs each have 18
// NVLinks spread over four NVSwitches (4+5+5+4). It exports just what weft's discovery calls,
// with NVML's C signatures, so CI exercises the NVML path without a driver.
#include <cstdio>
#include <cstring>

extern "C" {

using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

static const unsigned kGpuBus[8] = {0x18, 0x1c, 0x58, 0x5c, 0x98, 0x9c, 0xd8, 0xdc};
static const unsigned kSwitchBus[4] = {0x05, 0x06, 0x07, 0x08};
static const unsigned kLinksPerSwitch[4] = {4, 5, 5, 4};
static bool gInit = false;

static unsigned indexOf(nvmlDevice_t d) {
  return static_cast<unsigned>(reinterpret_cast<unsigned long>(d) - 1);
}

static void fill(nvmlPciInfo_t* p, unsigned bus) {
  std::memset(p, 0, sizeof *p);
  p->bus = bus;
  std::snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", bus);
  std::snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", bus);
}

// Link l of any GPU goes to switch s where s is the bundle containing l.
static unsigned switchOf(unsigned link) {
  unsigned s = 0, first = 0;
  while (link >= first + kLinksPerSwitch[s]) first += kLinksPerSwitch[s++];
  return s;
}

nvmlReturn_t nvmlInit_v2() {
  gInit = true;
  return 0;
}
nvmlReturn_t nvmlShutdown() {
  gInit = false;
  return 0;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* n) {
  *n = 8;
  return gInit ? 0 : 1;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t* d) {
  if (i >= 8) return 2;
  *d = reinterpret_cast<nvmlDevice_t>(static_cast<unsigned long>(i) + 1);
  return 0;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t* p) {
  fill(p, kGpuBus[indexOf(d)]);
  return 0;
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t, int* major, int* minor) {
  *major = 9;
  *minor = 0;
  return 0;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t, unsigned link, int* state) {
  *state = link < 18 ? 1 : 0;
  return 0;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t, unsigned link, nvmlPciInfo_t* p) {
  fill(p, kSwitchBus[switchOf(link)]);
  return 0;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t, unsigned, int* type) {
  *type = 2;  // NVML_NVLINK_DEVICE_TYPE_SWITCH
  return 0;
}

}  // extern "C"
