// bench: the trainer side's read floor. Any detect or publish from fp32
// masters must read every master (4 bytes per element) and every published
// bf16 element (2 bytes): a bare pass doing only that bounds them, and is
// measured in the same run as their memcpy baseline. Figures, never
// pass/fail.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "deltasync/weight_state.h"

namespace deltasync::cli {

// XOR of every 8-byte word of [p, p + bytes) (and the tail's bytes), with
// four independent accumulators: a load-bound loop, far faster than memory
// on one core (two 8-byte loads a cycle), so it runs at the memory's speed
// as any SIMD read would. The simplest exact read of a buffer.
uint64_t ReadFold(const uint8_t* p, size_t bytes);

// Best seconds of `reps` passes on `threads` threads that read every byte of
// `masters` and of the `published` tensor of the same name (tensors missing
// from `published` are read alone), in pieces of 1 Mi elements handed out
// in order, as the scans hand out their chunks. Nothing is written.
double ReadFloorSeconds(std::span<const TensorView> masters, const WeightState& published, int threads, int reps);

}  // namespace deltasync::cli
