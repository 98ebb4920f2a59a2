// The checks a delta's changes of one tensor must pass against the state
// they apply to (internal to src/codec), shared by ValidateChanges (decoded
// indices) and ValidateEncodedChanges (gaps still encoded), so both routes
// refuse the same input with the same message.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>

#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync::codec {

// kCorruption unless `name` is a tensor of `state` not yet in `seen` (it is
// added), of `dtype`, `value_bytes` is `count` values of it, and the largest
// index (`last`, when there are changes) is in range.
Status CheckChangedTensor(const WeightState& state, std::unordered_set<std::string_view>& seen,
                          const std::string& name, DType dtype, uint64_t count, size_t value_bytes,
                          std::optional<uint64_t> last);

}  // namespace deltasync::codec
