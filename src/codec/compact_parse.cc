// ParseCompactDelta (deltasync/compact.h): the compact decoder's step 1
// (every stream's entropy decode) alone, through the decoder's own read
// (compact_read.h).
#include "codec/compact_read.h"

#include <optional>

#include "codec/compact_container.h"
#include "deltasync/compact.h"

namespace deltasync {

uint64_t CompactParse::changes() const {
  uint64_t n = 0;
  for (const Tensor& t : tensors) n += t.bf16 ? t.ranks32.size() + t.ranks.size() : t.raw.indices.size();
  return n;
}

Status ParseCompactDelta(const SafetensorsFile& file, std::span<const TensorView> base, int threads,
                         CompactParse& out) {
  const std::string& label = file.label();
  DS_ASSIGN_OR_RETURN(const std::vector<compact::Stream> listed, compact::ListStreams(file, base));
  std::vector<const TensorView*> streams, bases;
  for (const compact::Stream& s : listed) {
    streams.push_back(&s.stream);
    bases.push_back(&base[s.base]);
  }
  std::optional<compact::V3Tables> tables;
  DS_RETURN_IF_ERROR(compact::ParseDeltaTables(file, tables));
  const compact::V3Tables* t = tables ? &*tables : nullptr;
  out.tensors.resize(streams.size());
  // The decoder's per-tensor state over this call's reused buffers.
  std::vector<compact::Bf16Tensor> bfs(streams.size());
  std::vector<TensorChanges> raw(streams.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    CompactParse::Tensor& o = out.tensors[i];
    compact::Bf16Tensor& bf = bfs[i];
    bf.ranks.narrow.swap(o.ranks32);
    bf.ranks.wide.swap(o.ranks);
    bf.diffs.swap(o.diffs);
    bf.escapes.swap(o.escapes);
    bf.escaped.swap(o.escaped);
    bf.escaped.clear();
    raw[i].indices.swap(o.raw.indices);
    raw[i].values.swap(o.raw.values);
    raw[i].indices.clear();
    raw[i].values.clear();
  }
  std::vector<Status> errors;
  compact::ReadCompactStreams(label, streams, bases, t, threads, raw, bfs, errors);
  for (size_t i = 0; i < streams.size(); ++i) {
    CompactParse::Tensor& o = out.tensors[i];
    compact::Bf16Tensor& bf = bfs[i];
    o.raw.indices.swap(raw[i].indices);
    o.raw.values.swap(raw[i].values);
    o.raw.name = raw[i].name;
    o.raw.dtype = raw[i].dtype;
    o.name = bases[i]->name;
    // A refused stream's tensor is left empty: its buffers, sized ahead,
    // may hold slots the parse never reached (UninitVector: not zeroed).
    o.bf16 = bf.base != nullptr && errors[i].ok();
    if (!errors[i].ok()) {
      o.raw.indices.clear();
      o.raw.values.clear();
    }
    o.class_begin = bf.class_begin;
    o.ranks32.swap(bf.ranks.narrow);
    o.ranks.swap(bf.ranks.wide);
    o.diffs.swap(bf.diffs);
    o.escapes.swap(bf.escapes);
    o.escaped.swap(bf.escaped);
    if (!o.bf16) {
      o.ranks32.clear();
      o.ranks.clear();
      o.diffs.clear();
      o.escapes.clear();
      o.escaped.clear();
      o.class_begin = {};
    }
  }
  for (const Status& s : errors) DS_RETURN_IF_ERROR(s);
  return Status::OK();
}

}  // namespace deltasync
