// SimdRouteName (deltasync/simd_route.h).
#include "deltasync/simd_route.h"

#include "bf16/simd_kernels.h"

namespace deltasync {

std::string SimdRouteName() { return kernels::ActiveTargetName(); }

}  // namespace deltasync
