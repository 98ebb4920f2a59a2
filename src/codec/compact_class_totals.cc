// The class totals a replica holds for the compact apply
// (include/deltasync/compact_class_totals.h).
#include "deltasync/compact_class_totals.h"

#include <utility>

namespace deltasync {

const CompactClassTotals::State* CompactClassTotals::Find(const StateHash& hash, uint64_t chunk_elements) const {
  for (const State& s : states) {
    if (s.valid && s.hash == hash && s.chunk_elements == chunk_elements) return &s;
  }
  return nullptr;
}

CompactClassTotals::State* CompactClassTotals::Find(const StateHash& hash, uint64_t chunk_elements) {
  return const_cast<State*>(std::as_const(*this).Find(hash, chunk_elements));
}

void CompactClassTotals::Invalidate() {
  for (State& s : states) s.valid = false;
}

void CompactClassTotals::Rename(const StateHash& from, const StateHash& to) {
  for (State& s : states) {
    if (s.valid && s.hash == from) {
      s.hash = to;
      return;
    }
  }
}

uint64_t CompactClassTotals::HeldBytes() const {
  uint64_t bytes = 0;
  for (const State& s : states) {
    if (!s.valid) continue;
    for (const Tensor& t : s.tensors) {
      if (t.elements != 0) bytes += t.chunks.size() * sizeof(t.chunks[0]);
    }
  }
  return bytes;
}

}  // namespace deltasync
