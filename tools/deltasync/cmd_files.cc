// diff, apply, inspect: commands on local safetensors files.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>
#include <utility>
#include <nlohmann/json.hpp>

#include "codec_stats.h"
#include "commands.h"
#include "deltasync/changes.h"
#include "deltasync/compact.h"
#include "deltasync/detect_encode.h"
#include "deltasync/state_hash.h"
#include "deltasync/patch.h"
#include "deltasync/publisher.h"
#include "deltasync/safetensors.h"
#include "inspect_part.h"
#include "output.h"

namespace deltasync::cli {
namespace {

bool IsPatch(const SafetensorsFile& f) { return LooksLikeTrlPatch(f.metadata()); }

std::optional<uint64_t> ParseU64(const Metadata& m, const std::string& key) {
  auto it = m.find(key);
  if (it == m.end() || it->second.empty()) return std::nullopt;
  uint64_t v = 0;
  for (char c : it->second) {
    if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10) return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}


// The Publisher's default fp32 policy: what `diff` and `inspect --base` read.
DetectOptions PublishedPolicy(bool allow_nonfinite) {
  return DetectOptions{allow_nonfinite, 0, [](std::string_view name) {
                         for (const std::string& suffix : PublisherOptions{}.keep_fp32_suffixes) {
                           if (name.ends_with(suffix)) return true;
                         }
                         return false;
                       }};
}

// A container-2 compact delta's changed tensors are named by their index in
// the base's name order: their names from `base_path`, whose state (as
// published) must hash to the delta's base state hash.
Result<std::vector<std::string>> BaseNames(const std::string& base_path, const Metadata& delta_metadata) {
  DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(base_path));
  // NaN/Inf pass: the base is only named and hashed (a bucket may allow them).
  Result<PublishedViews> base = ViewAsPublished(file.tensors(), PublishedPolicy(true));
  if (!base.ok()) return base.status().WithContext(base_path);
  const std::string hash = HashTensors(base->tensors).Hex();
  auto want = delta_metadata.find(std::string(kBaseStateHashKey));
  if (want == delta_metadata.end() || want->second != hash) {
    return Status::FailedPrecondition(base_path + " hashes to " + hash + ", not the delta's base state hash " +
                                      (want == delta_metadata.end() ? "(none)" : want->second));
  }
  std::vector<std::string> names;
  for (const TensorView& t : base->tensors) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  return names;
}

// What `diff` prints without --json.
void PrintDiffLine(const std::string& out_path, uint64_t changed_tensors, uint64_t changed, uint64_t total_elements,
                   uint64_t patch_size) {
  const double total = static_cast<double>(total_elements);
  std::printf("wrote %s: %llu tensors changed, %llu of %llu elements (%.3f%%), %s (%.2f B per changed element)\n",
              out_path.c_str(), static_cast<unsigned long long>(changed_tensors),
              static_cast<unsigned long long>(changed), static_cast<unsigned long long>(total_elements),
              total > 0 ? 100.0 * static_cast<double>(changed) / total : 0.0,
              HumanBytes(static_cast<double>(patch_size)).c_str(),
              changed ? static_cast<double>(patch_size) / static_cast<double>(changed) : 0.0);
}

// BASE as `diff` reads OLD (fp32 rounded to bf16, docs/cli.md), when that
// state, not BASE as it is, has the hash `want` that a delta names: so that
// `apply OLD PATCH` takes the fp32 OLD that `diff OLD NEW` read (it was
// refused as "another base"). Nothing when BASE has no fp32 to round.
std::optional<WeightState> BaseAsDiffReadIt(const SafetensorsFile& base, const StateHash& want) {
  Result<PublishedViews> published = ViewAsPublished(base.tensors(), PublishedPolicy(true));
  if (!published.ok() || published->rounded.tensors().empty() || !(HashTensors(published->tensors) == want)) {
    return std::nullopt;
  }
  Result<WeightState> state = WeightState::FromViews(published->tensors);
  if (!state.ok()) return std::nullopt;
  return std::move(state).value();
}

}  // namespace

Status RunDiff(const DiffArgs& args) {
  DS_ASSIGN_OR_RETURN(IndexEncoding encoding, ParseEncoding(args.encoding));
  if (args.stream_version && encoding != IndexEncoding::kCompact) {
    return Status::InvalidArgument("--stream-version applies only to --encoding compact");
  }
  if (args.container && encoding != IndexEncoding::kCompact) {
    return Status::InvalidArgument("--container applies only to --encoding compact");
  }
  DS_RETURN_IF_ERROR(CheckOutputIsNotInput(args.out_path, {{"OLD", args.old_path}, {"NEW", args.new_path}}));
  DS_ASSIGN_OR_RETURN(SafetensorsFile old_file, SafetensorsFile::Open(args.old_path));
  DS_ASSIGN_OR_RETURN(SafetensorsFile new_file, SafetensorsFile::Open(args.new_path));
  // Both read where they are mapped: a save into either while they were read
  // would make a patch between states neither file held.
  const auto unchanged = [&] {
    Status old_same = old_file.CheckUnchanged();
    return old_same.ok() ? new_file.CheckUnchanged() : old_same;
  };
  // The same fp32 policy as the Publisher's default.
  const DetectOptions options = PublishedPolicy(args.allow_nonfinite);
  // Both files are read where they are mapped: only OLD's f32 tensors that
  // round to bf16 are copied.
  Result<PublishedViews> base = ViewAsPublished(old_file.tensors(), options);
  if (!base.ok()) return base.status().WithContext(args.old_path);
  const std::span<const TensorView> base_views = base->tensors;
  const std::string comparing = "comparing " + args.old_path + " with " + args.new_path;
  PatchInfo info;
  info.kind = PatchKind::kDelta;
  info.model_version = args.version;
  info.encoding = encoding;
  info.total_elements = base->total_elements();
  // The exact state the patch applies to, as `apply` hashes its BASE: a TRL
  // delta names it in deltasync_base_state_hash, so that `apply` refuses any
  // other base of the same shapes (without it, such a base took the changes
  // silently and OUT looked like a good result); a compact delta always did.
  const StateHash base_hash = HashTensors(base_views);
  if (encoding != IndexEncoding::kCompact) info.base_state_hash = base_hash;
  if (encoding == IndexEncoding::kGapDelta && !args.json) {
    // One pass: the scan writes the patch's streams (the bytes DetectChanges
    // + EncodeDelta write; --json measures the changes, so it takes those).
    DetectedGapDelta fused;
    Status s = DetectAndEncodeGapDelta(base_views, new_file.tensors(), options, info, fused);
    if (!s.ok()) return s.WithContext(comparing);
    DS_RETURN_IF_ERROR(unchanged());
    DS_RETURN_IF_ERROR(WritePatchFile(args.out_path, fused.patch));
    PrintDiffLine(args.out_path, fused.changed_tensors, fused.changed, info.total_elements, fused.patch.size);
    return Status::OK();
  }
  Result<std::vector<TensorChanges>> changes = DetectChanges(base_views, new_file.tensors(), options);
  if (!changes.ok()) return changes.status().WithContext(comparing);
  EncodedPatch patch;
  if (encoding == IndexEncoding::kCompact) {
    // Valid only on this exact base: the patch names its state hash.
    info.base_version = args.base_version.value_or(args.version - 1);
    if (*info.base_version >= args.version) {
      return Status::InvalidArgument("--base-version " + std::to_string(*info.base_version) +
                                     " must be below --version " + std::to_string(args.version));
    }
    const int stream_version = static_cast<int>(args.stream_version.value_or(kDefaultCompactStreamVersion));
    const int container = static_cast<int>(args.container.value_or(kDefaultCompactContainer));
    DS_ASSIGN_OR_RETURN(patch, EncodeCompactDelta(info, base_hash, base_views, *changes, 0, stream_version,
                                                  container));
  } else {
    DS_ASSIGN_OR_RETURN(patch, EncodeDelta(info, *changes));
  }
  DS_RETURN_IF_ERROR(unchanged());
  DS_RETURN_IF_ERROR(WritePatchFile(args.out_path, patch));
  uint64_t changed = 0;
  for (const TensorChanges& c : *changes) changed += c.count();
  double total = static_cast<double>(info.total_elements);
  if (args.json) {
    nlohmann::ordered_json out;
    out["output"] = args.out_path;
    out["encoding"] = args.encoding;
    out["changed_tensors"] = changes->size();
    out["changed_elements"] = changed;
    out["total_elements"] = info.total_elements;
    out["changed_fraction"] = total > 0 ? changed / total : 0.0;
    out["size_bytes"] = patch.size;
    nlohmann::ordered_json none;
    if (changed == 0) {
      for (const char* key : {"bytes_per_changed_element", "entropy_bytes_per_changed",
                              "context_entropy_bytes_per_changed"}) {
        out[key] = none;
      }
    } else {
      const DeltaEntropy h = MeasureDeltaEntropy(base_views, *changes);
      out["bytes_per_changed_element"] = static_cast<double>(patch.size) / static_cast<double>(changed);
      out["entropy_bytes_per_changed"] = h.entropy;
      out["context_entropy_bytes_per_changed"] = h.context_entropy;
    }
    PrintJson(out);
    return Status::OK();
  }
  PrintDiffLine(args.out_path, changes->size(), changed, info.total_elements, patch.size);
  return Status::OK();
}

Status RunApply(const ApplyArgs& args) {
  {
    // OUT may be BASE (updated in place, atomically), not one of the patches.
    std::vector<std::pair<std::string, std::string>> patches;
    for (const std::string& p : args.patch_paths) patches.emplace_back("a PATCH", p);
    DS_RETURN_IF_ERROR(CheckOutputIsNotInput(args.out_path, patches));
  }
  DS_ASSIGN_OR_RETURN(SafetensorsFile base_file, SafetensorsFile::Open(args.base_path));
  DS_ASSIGN_OR_RETURN(WeightState state, WeightState::FromViews(base_file.tensors()));
  std::optional<uint64_t> version = ParseU64(base_file.metadata(), "model_version");
  bool state_is_base = true;  // nothing applied yet (BaseAsDiffReadIt may replace it)
  std::vector<uint8_t> undo;  // ApplyGapChanges' scratch, reused across patches
  // Every input read mapped, checked once all were read: a file cut short
  // while mapped reads as zeros past the cut (Blob::MapFile) and must not
  // make OUT.
  std::vector<SafetensorsFile> inputs = {base_file};
  for (const std::string& path : args.patch_paths) {
    DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
    inputs.push_back(file);
    const bool first = std::exchange(state_is_base, false);
    if (IsCompactDelta(file)) {
      auto named = file.metadata().find(std::string(kBaseStateHashKey));
      if (first && named != file.metadata().end()) {
        Result<StateHash> want = StateHash::FromHex(named->second);
        std::optional<WeightState> read = want.ok() ? BaseAsDiffReadIt(base_file, *want) : std::nullopt;
        if (read) state = std::move(*read);
      }
      // Checked against the state's own hash: refused unless it is the base.
      Result<CompactDelta> delta = DecodeCompactDelta(file, state, HashState(state));
      if (!delta.ok()) return delta.status().WithContext(path);
      ApplyChanges(state, delta->changes);
      version = delta->info.model_version;
      continue;
    }
    if (IsCompressedAnchor(file)) {
      DS_ASSIGN_OR_RETURN(DecodedAnchor anchor, DecodeCompressedAnchor(file));
      DS_ASSIGN_OR_RETURN(state, WeightState::FromTensors(std::move(anchor.tensors)));
      version = anchor.model_version;
      continue;
    }
    DS_ASSIGN_OR_RETURN(DecodedPatch patch, DecodePatch(std::move(file), {.keep_gaps_encoded = true}));
    if (patch.info.kind == PatchKind::kAnchor) {
      DS_ASSIGN_OR_RETURN(state, WeightState::FromViews(patch.dense));
    } else {
      if (patch.info.base_version && version && *patch.info.base_version != *version) {
        return Status::FailedPrecondition(path + ": applies to version " + std::to_string(*patch.info.base_version) +
                                          " but the state is at version " + std::to_string(*version));
      }
      if (patch.info.base_state_hash) {
        std::optional<WeightState> read = first ? BaseAsDiffReadIt(base_file, *patch.info.base_state_hash)
                                                : std::nullopt;
        if (read) state = std::move(*read);
        const StateHash have = HashState(state);
        if (!(have == *patch.info.base_state_hash)) {
          return Status::FailedPrecondition(
              path + ": delta to version " + std::to_string(patch.info.model_version) + " applies to state hash " +
              patch.info.base_state_hash->Hex() + ", but the state it was given has state hash " + have.Hex() +
              " (another base, or the patches out of order)");
        }
      }
      if (!patch.encoded.empty() || patch.changes.empty()) {
        // gap_delta: applied straight from the file's gaps in one pass (the
        // replica's path), with the same checks first. The state hash it
        // returns is not needed here: a TRL patch names none.
        DS_RETURN_IF_ERROR(ValidateEncodedChanges(state, patch.encoded).WithContext(path));
        ApplyGapChanges(state, patch.encoded, /*threads=*/0, undo);
      } else {
        DS_RETURN_IF_ERROR(ValidateChanges(state, patch.changes).WithContext(path));
        ApplyChanges(state, patch.changes);
      }
    }
    version = patch.info.model_version;
  }
  for (const SafetensorsFile& input : inputs) DS_RETURN_IF_ERROR(input.CheckUnchanged());
  DS_RETURN_IF_ERROR(WriteStateFile(args.out_path, state, version.value_or(0)));
  std::printf("wrote %s: version %llu, %zu tensors, %llu elements\n", args.out_path.c_str(),
              static_cast<unsigned long long>(version.value_or(0)), state.tensors().size(),
              static_cast<unsigned long long>(state.total_elements()));
  return Status::OK();
}

namespace {

// What inspect prints (docs/cli.md's keys), from the file's header and, for
// deltas and anchors, its decoded bytes.
Result<nlohmann::ordered_json> DescribeFile(SafetensorsFile file, const InspectArgs& args) {
  const uint64_t size = file.blob().size();
  nlohmann::ordered_json out;
  out["path"] = args.path;
  out["size_bytes"] = size;
  out["metadata"] = file.metadata();
  const nlohmann::ordered_json part = DescribePartObject(args.path);
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const TensorView& t : file.tensors()) {
    tensors.push_back({{"name", t.name}, {"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"bytes", t.data.size()}});
  }

  uint64_t total = 0, changed = 0, params = 0;
  if (IsCompactDelta(file)) {
    DS_ASSIGN_OR_RETURN(CompactStreamSizes sizes, MeasureCompactDelta(file));
    const Metadata& m = file.metadata();
    out["kind"] = "delta";
    out["model_version"] = ParseU64(m, "model_version").value_or(0);
    std::optional<uint64_t> base = ParseU64(m, "deltasync_base_version");
    out["base_version"] = base ? nlohmann::ordered_json(*base) : nlohmann::ordered_json();
    out["encoding"] = "compact";
    auto hash = m.find("deltasync_base_state_hash");
    out["base_state_hash"] = hash == m.end() ? "" : hash->second;
    changed = sizes.changed;
    params = sizes.tensors;
    total = ParseU64(m, "total_elements").value_or(0);
    out["container"] = sizes.container;
    // Container 2 lists tensors by index in the base's name order: named
    // from --base, or from the part's blocks when the manifest lists them.
    std::optional<std::vector<std::string>> names;
    if (!args.base_path.empty()) {
      DS_ASSIGN_OR_RETURN(names, BaseNames(args.base_path, m));
    } else if (sizes.container == 2 && part.is_object() && part["blocks"].is_array()) {
      names.emplace();
      for (const auto& b : part["blocks"]) names->push_back(b["name"].get<std::string>());
    }
    nlohmann::ordered_json changed_tensors = nlohmann::ordered_json::array();
    for (const CompactStreamSizes::Tensor& t : sizes.changed_tensors) {
      nlohmann::ordered_json name = t.name;
      if (t.base_index) {
        if (names && *t.base_index >= names->size()) {
          return Status::Corruption(args.path + ": tensor index " + std::to_string(*t.base_index) +
                                    " is past the base's " + std::to_string(names->size()) + " tensors");
        }
        name = names ? nlohmann::ordered_json((*names)[*t.base_index]) : nlohmann::ordered_json();
      }
      // A non-bf16 stream carries the base's dtype, which the delta does not name.
      changed_tensors.push_back({{"name", name},
                                 {"base_index", t.base_index ? nlohmann::ordered_json(*t.base_index)
                                                             : nlohmann::ordered_json()},
                                 {"dtype", t.bf16 ? nlohmann::ordered_json("BF16") : nlohmann::ordered_json()},
                                 {"changed", t.changed}});
    }
    out["changed_tensors"] = changed_tensors;
    auto per = [&](uint64_t bytes) {
      return nlohmann::ordered_json{
          {"bytes", bytes}, {"bytes_per_changed_element", changed ? static_cast<double>(bytes) / changed : 0.0}};
    };
    out["streams"] = {{"header", per(sizes.header_bytes)},
                      {"gaps", per(sizes.gap_bytes)},
                      {"ulp_diffs", per(sizes.diff_bytes)},
                      {"escapes", per(sizes.escape_bytes)},
                      {"raw_values", per(sizes.value_bytes)}};
  } else if (IsCompressedAnchor(file)) {
    DS_ASSIGN_OR_RETURN(DecodedAnchor anchor, DecodeCompressedAnchor(file));
    uint64_t raw = 0;
    for (const WeightState::Tensor& t : anchor.tensors) {
      total += t.num_elements();
      raw += t.data.size();
    }
    out["kind"] = "anchor";
    out["model_version"] = anchor.model_version;
    out["base_version"] = nullptr;
    out["encoding"] = "compact";
    out["raw_bytes"] = raw;
    out["compression_ratio"] = size ? static_cast<double>(raw) / static_cast<double>(size) : 0.0;
    changed = total;
    params = anchor.tensors.size();
    // The model's tensors, not the compressed blobs that hold them.
    tensors = nlohmann::ordered_json::array();
    for (const WeightState::Tensor& t : anchor.tensors) {
      tensors.push_back(
          {{"name", t.name}, {"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"bytes", t.data.size()}});
    }
  } else if (!IsPatch(file)) {
    out["kind"] = "plain";
    for (const TensorView& t : file.tensors()) total += t.num_elements();
    changed = total;
    params = file.tensors().size();
  } else {
    DS_ASSIGN_OR_RETURN(DecodedPatch patch, DecodePatch(std::move(file)));
    const PatchInfo& info = patch.info;
    out["kind"] = info.kind == PatchKind::kAnchor ? "anchor" : "delta";
    out["model_version"] = info.model_version;
    out["base_version"] = info.base_version ? nlohmann::ordered_json(*info.base_version) : nlohmann::ordered_json();
    out["encoding"] = EncodingName(info.encoding);
    if (info.kind == PatchKind::kAnchor) {
      for (const TensorView& t : patch.dense) total += t.num_elements();
      changed = total;
      params = patch.dense.size();
    } else {
      nlohmann::ordered_json per = nlohmann::ordered_json::array();
      for (const TensorChanges& c : patch.changes) {
        changed += c.count();
        per.push_back({{"name", c.name}, {"dtype", DTypeName(c.dtype)}, {"changed", c.count()}});
      }
      params = patch.changes.size();
      total = info.total_elements;
      out["changed_tensors"] = per;
    }
  }
  out["total_elements"] = total;
  out["changed_elements"] = changed;
  out["changed_params"] = params;
  out["sparsity"] = total ? 1.0 - static_cast<double>(changed) / static_cast<double>(total) : 0.0;
  // A plain checkpoint changes nothing: no bytes per changed element.
  out["bytes_per_changed_element"] = out["kind"] == "plain" ? nlohmann::ordered_json()
                                     : nlohmann::ordered_json(changed ? static_cast<double>(size) / changed : 0.0);
  out["tensors"] = tensors;
  out["part"] = part;
  return out;
}

}  // namespace

Status RunInspect(const InspectArgs& args) {
  DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(args.path));
  Result<nlohmann::ordered_json> described = DescribeFile(file, args);
  // A file written into or cut short while it was read (a delta a trainer
  // saves in place) is described from a torn read: refused, also when that
  // made the decode fail (the change is the error to report).
  DS_RETURN_IF_ERROR(file.CheckUnchanged());
  if (!described.ok()) return described.status();
  const nlohmann::ordered_json& out = *described;
  const uint64_t size = out["size_bytes"].get<uint64_t>(), total = out["total_elements"].get<uint64_t>();
  const uint64_t changed = out["changed_elements"].get<uint64_t>(), params = out["changed_params"].get<uint64_t>();
  const nlohmann::ordered_json& part = out["part"];
  if (args.json) {
    std::cout << out.dump() << "\n";
    return Status::OK();
  }
  std::printf("%s: %s, %s\n", args.path.c_str(), out["kind"].get<std::string>().c_str(),
              HumanBytes(static_cast<double>(size)).c_str());
  if (out["kind"] != "plain") {
    std::printf("  model_version %llu, encoding %s%s\n",
                static_cast<unsigned long long>(out["model_version"].get<uint64_t>()),
                out["encoding"].get<std::string>().c_str(),
                out["base_version"].is_null()
                    ? ""
                    : (", base version " + std::to_string(out["base_version"].get<uint64_t>())).c_str());
  }
  if (!part.is_null()) {
    std::printf("  part %llu of %llu", static_cast<unsigned long long>(part["part"].get<uint64_t>()),
                static_cast<unsigned long long>(part["parts"].get<uint64_t>()));
    if (part["listed"].get<bool>()) {
      std::printf(" (layout %s), %zu block(s) (element counts below are the part's):\n",
                  part["layout"].get<std::string>().c_str(), part["blocks"].size());
      for (const auto& b : part["blocks"]) {
        std::printf("    %-60s offset %s shape %s of %s\n", b["name"].get<std::string>().c_str(),
                    b["offset"].dump().c_str(), b["shape"].dump().c_str(), b["full_shape"].dump().c_str());
      }
    } else {
      std::printf(" (not listed by a manifest next to it: blocks unknown; inspect it inside its bucket)\n");
    }
  }
  if (out["kind"] == "plain") {
    std::printf("  %llu elements in %llu tensors\n", static_cast<unsigned long long>(total),
                static_cast<unsigned long long>(params));
  } else {
    std::printf("  %llu of %llu elements %s in %llu tensors (sparsity %.4f), %.2f bytes per changed element\n",
                static_cast<unsigned long long>(changed), static_cast<unsigned long long>(total),
                out["kind"] == "delta" ? "changed" : "stored", static_cast<unsigned long long>(params),
                out["sparsity"].get<double>(), out["bytes_per_changed_element"].get<double>());
  }
  if (out.contains("streams")) {
    std::printf("  streams (bytes, bytes per changed element):\n");
    for (const auto& [name, v] : out["streams"].items()) {
      std::printf("    %-10s %12llu  %.3f\n", name.c_str(), static_cast<unsigned long long>(v["bytes"].get<uint64_t>()),
                  v["bytes_per_changed_element"].get<double>());
    }
  }
  if (out.contains("compression_ratio")) {
    std::printf("  %s raw, compression ratio %.4f\n", HumanBytes(out["raw_bytes"].get<double>()).c_str(),
                out["compression_ratio"].get<double>());
  }
  if (out.contains("changed_tensors")) {
    std::printf("  changed tensors (%zu):\n", out["changed_tensors"].size());
    for (const auto& t : out["changed_tensors"]) {
      const std::string name = t["name"].is_string() ? t["name"].get<std::string>()
                                                     : std::string("#")
                                                           .append(std::to_string(t["base_index"].get<uint64_t>()))
                                                           .append(" (name it with --base)");
      std::printf("    %-60s %-5s %llu changed\n", name.c_str(),
                  t["dtype"].is_null() ? "-" : t["dtype"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(t["changed"].get<uint64_t>()));
    }
  }
  std::printf("  metadata:\n");
  for (const auto& [k, v] : out["metadata"].items()) std::printf("    %s = %s\n", k.c_str(), v.get<std::string>().c_str());
  std::printf("  tensors (%zu):\n", out["tensors"].size());
  for (const auto& t : out["tensors"]) {
    std::printf("    %-60s %-5s %s\n", t["name"].get<std::string>().c_str(), t["dtype"].get<std::string>().c_str(),
                t["shape"].dump().c_str());
  }
  return Status::OK();
}

}  // namespace deltasync::cli
