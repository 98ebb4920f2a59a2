// The manifest: `manifest.json` at the bucket root, written last on every
// publish. It is the bucket's table of contents and the replicas' root of
// trust: every object a replica downloads is checked against the size and
// XXH3-128 listed here, and every state it reaches against the state hash.
// Byte-level specification: docs/format.md, "Manifest".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltasync/parts.h"
#include "deltasync/patch.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync {

inline constexpr std::string_view kManifestKey = "manifest.json";

// "anchors/step_000010.safetensors", "deltas/step_000011.safetensors".
// TRL's names, for TRL-format objects (encodings raw and gap_delta).
std::string AnchorKey(uint64_t version);
std::string DeltaKey(uint64_t version);
// deltasync-native objects live under ds/, so that a TRL reader listing
// anchors/ and deltas/ never meets a file it cannot read:
// "ds/anchors/step_000010.safetensors" (compressed anchor),
// "ds/deltas/step_000011.safetensors" (compact delta),
// "ds/cumulative/step_000015_from_000010.compact.safetensors" (a delta from
// an anchor, in any encoding).
std::string CompressedAnchorKey(uint64_t version);
std::string CompactDeltaKey(uint64_t version);
std::string CumulativeDeltaKey(uint64_t base_version, uint64_t version, IndexEncoding encoding);

// "ds/files/<xxh3_128>": a side file's object, named by its content.
std::string FileObjectKey(std::string_view xxh3_128);

// XXH3-128 of `parts` concatenated, as 32 lower-case hex digits (high 64 bits
// first, each big-endian: XXH3's canonical form).
std::string Xxh3Hex(std::span<const ByteSpan> parts);
inline std::string Xxh3Hex(ByteSpan bytes) { return Xxh3Hex(std::span<const ByteSpan>(&bytes, 1)); }

// One stored object of a parted version's object (a part's anchor or delta).
struct PartObject {
  std::string key;
  uint64_t size = 0;
  std::string xxh3_128;  // 32 hex digits
  friend bool operator==(const PartObject&, const PartObject&) = default;
};

// An anchor or a delta of a version. In a parted version (VersionEntry::
// layout set) it is a set of stored objects, one per part in part order
// (`parts`); `key` and `xxh3_128` are then empty and `size` is their sum.
struct ObjectEntry {
  PatchKind kind = PatchKind::kDelta;
  std::string key;
  IndexEncoding encoding = IndexEncoding::kGapDelta;
  uint64_t size = 0;
  std::string xxh3_128;                 // 32 hex digits
  std::optional<uint64_t> base_version;  // deltas only
  std::vector<PartObject> parts;         // parted versions only

  bool parted() const { return !parts.empty(); }
};

// The objects a replica downloads for `object`: itself, or its parts.
std::vector<PartObject> StoredObjects(const ObjectEntry& object);

// A part of a parted version: the hash of its blocks (element terms only)
// and how many of their elements changed.
struct PartState {
  StateHash state_hash;
  uint64_t changed_elements = 0;
  friend bool operator==(const PartState&, const PartState&) = default;
};

// A side file of a version (config.json, tokenizer files: hf_folder.h), a
// content-addressed object.
struct FileEntry {
  std::string key;       // FileObjectKey(xxh3_128)
  uint64_t size = 0;
  std::string xxh3_128;  // 32 hex digits

  friend bool operator==(const FileEntry&, const FileEntry&) = default;
};
// Side files by name (a plain file name, ValidateSideFileName).
using FileSet = std::map<std::string, FileEntry>;

struct VersionEntry {
  uint64_t version = 0;
  StateHash state_hash;        // of the complete state after this version
  uint64_t total_elements = 0;
  // Elements that differ from the previous version; nullopt for a
  // recovered version (`recovered`: true in the manifest): an anchor-only
  // version published when the previous state could not be rebuilt
  // (Publisher::degraded()), so how much changed is not known. ToJson writes
  // total_elements there (readers before the marker require the field).
  std::optional<uint64_t> changed_elements = 0;
  uint64_t created_unix_ms = 0;
  // At most one anchor (raw: TRL; compact: compressed) and deltas from
  // distinct base versions: the step delta from the previous version and,
  // optionally, a cumulative delta from the last anchor.
  std::vector<ObjectEntry> objects;
  // The full set of side files, listed on the versions where the set
  // changed; nullopt: the same set as the previous listed version (none
  // before the first version that lists one). See Manifest::FilesAt.
  std::optional<FileSet> files;
  // Parted versions (docs/format.md, "Parts"): the digest of the manifest's
  // layout they follow and each part's state, in part order; empty for a
  // version published by one process.
  std::string layout;
  std::vector<PartState> parts;

  bool parted() const { return !layout.empty(); }
  const ObjectEntry* anchor() const;
  // The delta with the newest base (normally the previous version); nullptr
  // when none.
  const ObjectEntry* delta() const;
};

// Who wrote the manifest last: a publisher's random id and its commit count.
// A publisher whose conditional manifest write was retried after the first
// attempt landed (S3 then answers 412) recognises its own write by this.
struct WriterStamp {
  std::string id;    // 1-128 printable ASCII characters
  uint64_t seq = 0;  // this writer's commits to this bucket, counting from 1

  friend bool operator==(const WriterStamp&, const WriterStamp&) = default;
};

// The settings a bucket is published with (the manifest's optional
// "settings" object): a later Publisher uses them for the options it is not
// given and refuses different ones unless told to change them
// (PublisherOptions::change_settings). Meanings as in PublisherOptions.
struct BucketSettings {
  IndexEncoding encoding = IndexEncoding::kCompact;
  uint64_t anchor_interval = 10;  // at least 1
  uint64_t cumulative_interval = 0;
  double anchor_max_fraction = 0;  // finite, >= 0

  friend bool operator==(const BucketSettings&, const BucketSettings&) = default;
};

struct Manifest {
  // The top-level "anchor_interval", which manifests written before
  // "settings" existed carry alone. ToJson writes settings->anchor_interval
  // there when settings is set, so that older readers still find it.
  uint64_t anchor_interval = 10;
  std::optional<BucketSettings> settings;  // absent in older manifests
  std::optional<WriterStamp> writer;  // absent in manifests not written by a Publisher
  std::vector<VersionEntry> versions;  // strictly ascending by version
  // The part layouts parted versions follow, by digest (PartLayout::Digest).
  // ToJson writes those a version refers to; a manifest with any is
  // format_version 2.
  std::map<std::string, PartLayout> layouts;

  // nullptr when absent.
  const VersionEntry* Find(uint64_t version) const;
  // The layout of a parted version; nullptr for an unparted one.
  const PartLayout* LayoutOf(const VersionEntry& v) const;
  // nullptr when empty.
  const VersionEntry* Latest() const;
  // The side files of `version`: its own `files`, else those of the newest
  // listed version below it that has them; an empty set when none does.
  FileSet FilesAt(uint64_t version) const;

  // Deterministic JSON (docs/format.md), ending in '\n'.
  std::string ToJson() const;
  // Parses and validates (format tag, versions ascending, keys valid, hashes
  // 32 hex digits, a delta's base below its version, the first version an
  // anchor, side file names plain and keys content-addressed). kCorruption
  // naming `label` and the rule.
  static Result<Manifest> Parse(ByteSpan json, std::string_view label = kManifestKey);
};

class Store;
// The manifest of `store`, parsed. kNotFound (naming the bucket) when it has
// none: nothing published yet, or not a deltasync bucket.
Result<Manifest> FetchManifest(Store& store);

}  // namespace deltasync
