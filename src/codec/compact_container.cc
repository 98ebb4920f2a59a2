// A compact delta's containers (compact_container.h, docs/format.md
// "Containers").
#include "codec/compact_container.h"

#include <algorithm>

#include "codec/compact_bf16.h"
#include "codec/compact_streams.h"

namespace deltasync::compact {
namespace {

// Container 1: every tensor `{P}.cmp`, 1-D U8, in name order.
Status ReadContainer1(const SafetensorsFile& file, RawStreams& out) {
  for (const TensorView& s : file.tensors()) {
    const std::string& name = s.name;
    if (name.size() <= kStreamSuffix.size() || !name.ends_with(kStreamSuffix)) {
      return CorruptTensor(file.label(), name, "name does not end in '.cmp'");
    }
    if (s.dtype != DType::kU8 || s.shape.size() != 1) return CorruptTensor(file.label(), name, "not a 1-D U8 tensor");
    out.streams.push_back({name.substr(0, name.size() - kStreamSuffix.size()), 0, s.data});
  }
  std::sort(out.streams.begin(), out.streams.end(),
            [](const RawStream& a, const RawStream& b) { return a.param < b.param; });
  return Status::OK();
}

// Container 2: one tensor `streams`, 1-D U8: varint n, n x (varint index
// gap, varint length), then the n streams back to back, filling it exactly.
Status ReadContainer2(const SafetensorsFile& file, RawStreams& out) {
  const std::string& label = file.label();
  if (file.tensors().size() != 1 || file.tensors()[0].name != kContainerTensor) {
    return Status::Corruption(label + ": container 2 holds exactly one tensor '" + std::string(kContainerTensor) +
                              "', this file has " + std::to_string(file.tensors().size()) + " tensors" +
                              (file.tensors().empty() ? "" : ", the first '" + file.tensors()[0].name + "'"));
  }
  const TensorView& t = file.tensors()[0];
  auto bad = [&](const std::string& msg) { return CorruptTensor(label, t.name, msg); };
  if (t.dtype != DType::kU8 || t.shape.size() != 1) return bad("not a 1-D U8 tensor");
  Reader in(t.data);
  std::optional<uint64_t> n = in.Varint();
  if (!n) return bad("directory: truncated or malformed entry count");
  // An entry takes at least 2 bytes: checked before reserving.
  if (*n > in.remaining() / 2) {
    return bad("directory: " + std::to_string(*n) + " entries cannot fit in the tensor's " +
               std::to_string(t.data.size()) + " bytes");
  }
  std::vector<uint64_t> lengths(*n);
  out.streams.resize(*n);
  uint64_t next = 0;  // the previous entry's index + 1
  for (uint64_t k = 0; k < *n; ++k) {
    std::optional<uint64_t> gap = in.Varint();
    std::optional<uint64_t> length = in.Varint();
    if (!gap || !length) return bad("directory entry " + std::to_string(k) + " is truncated or malformed");
    if (*gap > UINT64_MAX - 1 - next) {  // next + gap would not fit
      return bad("directory entry " + std::to_string(k) + ": tensor index overflows");
    }
    out.streams[k].index = next + *gap;
    next = out.streams[k].index + 1;
    lengths[k] = *length;
  }
  for (uint64_t k = 0; k < *n; ++k) {
    if (lengths[k] > in.remaining()) {
      return bad("directory entry " + std::to_string(k) + ": stream length " + std::to_string(lengths[k]) +
                 " runs past the tensor (" + std::to_string(in.remaining()) + " bytes left)");
    }
    out.streams[k].bytes = *in.Take(lengths[k]);
  }
  if (in.remaining() != 0) {
    return bad(std::to_string(in.remaining()) + " trailing bytes after the last stream (the directory's lengths must fill the tensor)");
  }
  return Status::OK();
}

}  // namespace

Result<RawStreams> ReadContainer(const SafetensorsFile& file) {
  RawStreams out;
  auto it = file.metadata().find(std::string(kContainerKey));
  if (it == file.metadata().end()) {
    DS_RETURN_IF_ERROR(ReadContainer1(file, out));
    return out;
  }
  if (it->second != kContainer2Value) {
    std::string shown = it->second.substr(0, 40);
    for (char& ch : shown) ch = (ch >= 0x20 && ch < 0x7f) ? ch : '?';
    return Status::Corruption(file.label() + ": __metadata__ '" + std::string(kContainerKey) + "' is '" + shown +
                              "', expected '" + std::string(kContainer2Value) +
                              "' (container 1 is written without the key)");
  }
  out.container = 2;
  DS_RETURN_IF_ERROR(ReadContainer2(file, out));
  return out;
}

Result<std::vector<Stream>> ListStreams(const SafetensorsFile& file, std::span<const TensorView> base) {
  DS_ASSIGN_OR_RETURN(RawStreams raw, ReadContainer(file));
  std::vector<size_t> by_name(base.size());
  for (size_t i = 0; i < base.size(); ++i) by_name[i] = i;
  std::sort(by_name.begin(), by_name.end(), [&](size_t a, size_t b) { return base[a].name < base[b].name; });
  std::vector<Stream> out(raw.streams.size());
  for (size_t k = 0; k < raw.streams.size(); ++k) {
    const RawStream& r = raw.streams[k];
    size_t b;
    if (raw.container == 1) {
      auto found = std::lower_bound(by_name.begin(), by_name.end(), r.param,
                                    [&](size_t i, const std::string& p) { return base[i].name < p; });
      if (found == by_name.end() || base[*found].name != r.param) {
        return CorruptTensor(file.label(), r.param + std::string(kStreamSuffix), "names a tensor the base does not have");
      }
      b = *found;
    } else {
      if (r.index >= base.size()) {
        return CorruptTensor(file.label(), kContainerTensor,
                             "directory entry " + std::to_string(k) + ": tensor index " + std::to_string(r.index) +
                                 " is out of range (the base has " + std::to_string(base.size()) + " tensors)");
      }
      b = by_name[r.index];
    }
    out[k].base = b;
    out[k].stream = TensorView{base[b].name + std::string(kStreamSuffix), DType::kU8, {r.bytes.size()}, r.bytes};
  }
  return out;
}

std::vector<uint8_t> WriteContainer2Directory(std::span<const uint64_t> indices,
                                              std::span<const std::vector<uint8_t>> streams) {
  std::vector<uint8_t> out;
  out.reserve(10 + 20 * streams.size());
  PutVarint(out, streams.size());
  uint64_t next = 0;
  for (size_t k = 0; k < streams.size(); ++k) {
    PutVarint(out, indices[k] - next);
    next = indices[k] + 1;
    PutVarint(out, streams[k].size());
  }
  return out;
}

}  // namespace deltasync::compact
