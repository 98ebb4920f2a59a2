// UseClassMasksAll16 (class_masks_avx512.h): whether the target the kernels
// dispatch to runs the raw masks of every class. Compiled per target like
// the other kernels (foreach_target.h), so that a test or benchmark that
// picks a target (UseOnlyTarget) picks the walk's route with it.
#include "bf16/class_counts_avx512.h"
#include "bf16/class_masks_avx512.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bf16/class_masks_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace deltasync::kernels::HWY_NAMESPACE {

bool UseClassMasksAll16Impl() {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
  return HasClassCountsAvx512() && CpuHasClassMasksAvx512();
#else
  return false;
#endif
}

}  // namespace deltasync::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deltasync::kernels {

HWY_EXPORT(UseClassMasksAll16Impl);

bool UseClassMasksAll16() { return HWY_DYNAMIC_DISPATCH(UseClassMasksAll16Impl)(); }

}  // namespace deltasync::kernels
#endif  // HWY_ONCE
