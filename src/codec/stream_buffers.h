// Byte buffers an encoder keeps between encodes (internal).
//
// A compact delta's streams are written into std::vector<uint8_t>s that the
// EncodedPatch owns. Fresh ones each publish cost the kernel twice: page
// faults that zero every new page as the streams are written, and munmap of
// the large ones when the patch is freed (tens of MB at a few percent
// changed on a 0.6B model). A Publisher keeps the last patch's buffers here
// and the next encode writes its streams into them (cleared, capacity kept,
// pages already mapped), so a steady-state publish neither faults nor frees.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace deltasync::compact {

class StreamBuffers {
 public:
  // What is kept is bounded: after Give, at most the number of buffers
  // given, and a total capacity of at most kSlack * (bytes of the patch
  // given) + kFloor bytes (the largest buffers go first), so a publish that
  // needs much less than the last one releases the difference.
  static constexpr uint64_t kSlack = 4;
  static constexpr uint64_t kFloor = uint64_t{4} << 20;

  // An empty buffer: the largest kept one (capacity kept), or a new one.
  std::vector<uint8_t> Take();
  // Keeps `buffers` (a finished patch's, `used_bytes` in all) for later
  // Takes, with those not taken since the last Give; then applies the
  // bound above.
  void Give(std::vector<std::vector<uint8_t>> buffers, uint64_t used_bytes);
  // Frees everything kept.
  void Release();

  size_t count() const { return spare_.size(); }
  uint64_t capacity_bytes() const;

 private:
  std::vector<std::vector<uint8_t>> spare_;  // capacity ascending
};

}  // namespace deltasync::compact
