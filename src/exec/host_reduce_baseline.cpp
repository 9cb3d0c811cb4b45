// The host reduction compiled for baseline (flags in src/CMakeLists.txt).
#define WEFT_REDUCE_ISA baseline
#include "src/exec/host_reduce_impl.hpp"
