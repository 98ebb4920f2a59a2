// bench: the floor of the replica's compact decode and apply. The stages
// the current stream format requires of any decoder, each timed alone on
// the delta the bench applies (one thread, this thread's CPU time, best of
// reps): a plain read of the base's bf16 bytes (every element's exponent
// decides a change's position, and at the demo's change rate every block of
// 1024 elements holds a change, so no block can be skipped), the entropy
// decode (the library's own, ParseCompactDelta), the state-hash terms (the
// decoder's kernel, HashChanges16, over cache-sized slices of changes just
// written, as the decoder hashes each chunk's changes right after decoding
// them; the same over whole arrays streamed from memory is kept beside it,
// outside the sums), writing the decode's output, the
// scatter of the changed values (alone, and within the read while each
// block is in cache), and the object's digest. Their sums bound the decode
// per core and the whole apply on N threads from below. Figures,
// never pass/fail (docs/benchmarks.md, "What bounds the compact decode and
// apply").
#pragma once

#include <cstdint>
#include <vector>

#include "deltasync/blob.h"
#include "deltasync/changes.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/weight_state.h"

namespace deltasync::cli {

struct DecodeFloorFigures {
  uint64_t model_bytes = 0;
  uint64_t changed = 0;
  uint64_t read_bytes = 0;          // the bf16 tensors with changes: what a decode must read
  double blocks_with_change = 0;    // fraction of their 1024-element blocks holding a change
  double words_with_change = 0;     // fraction of their 64-element words holding a change
  int threads = 1;
  // Seconds, one thread (this thread's CPU time) unless named otherwise.
  double read_s = 0;            // an XOR of every 8-byte word of those tensors (ReadFold)
  double read_threads_s = 0;    // the same on `threads` threads, wall clock
  double parse_s = 0;           // ParseCompactDelta: gaps into ranks, diffs, escapes
  double output_s = 0;          // storing the decode's output: u64 index + u16 value per change
  double hash_s = 0;            // HashChanges16 of every change, each decode chunk's from cache
  double hash_streamed_s = 0;   // the same over whole tensors' arrays (streamed from memory)
  double scatter_s = 0;         // one u16 store per change at its index in the state, alone
  double read_scatter_s = 0;    // the read with each 1024-block's changes stored while it is in cache
  double read_scatter_threads_s = 0;  // the same on `threads` threads, wall clock
  double digest_s = 0;          // XXH3 of the delta's bytes (the object check)
  double decode_s = 0;          // DecodeCompactDelta on one thread, on the stages' clock

  // The decode's floor on one core: read, parse, output.
  double DecodeSeconds() const { return read_s + parse_s + output_s; }
  // The whole apply's floor on `threads` threads: the read with the
  // scatter as measured on them (memory, not cores, may bound it), the
  // per-change rest split evenly.
  double ApplySeconds() const { return read_scatter_threads_s + (digest_s + parse_s + hash_s) / threads; }
};

// Times the stages on `delta` (the compact delta of `changes` against
// `state`, whose hash is `base_hash`); `old` holds the same indices as `changes` with `state`'s values
// at them. `state` is left as it was (the scatter stores its own values).
// kInternal when a stage's result disagrees with the library's (the parse's
// change count, the hash).
Result<DecodeFloorFigures> MeasureDecodeFloor(WeightState& state, const StateHash& base_hash, const Blob& delta,
                                              const std::vector<TensorChanges>& changes,
                                              const std::vector<TensorChanges>& old, int threads, int reps);

// The floor as text lines: each stage in ns per change and s per GB of
// model, the decode floor per core and the apply floor against `memcpy_s`
// (same threads), and the library's decode and the measured apply
// (`apply_s`, same threads) as fractions of them.
void PrintDecodeFloor(const DecodeFloorFigures& f, double memcpy_s, double apply_s);

}  // namespace deltasync::cli
