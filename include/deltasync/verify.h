// Verifying a bucket (deltasync verify): downloads the objects the manifest
// lists, checks each one's size and XXH3-128, and replays them to check every
// state they reach against the manifest's state hash, and checks the side
// files (config, tokenizer: side_files.h) the checked versions list. Reads only; never
// writes to the bucket or to disk.
//
// Memory: one state at a time, plus what one replay step needs (a decoded
// anchor, or one delta's changes): never a state per version.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deltasync/status.h"
#include "deltasync/store.h"

namespace deltasync {

struct VerifyOptions {
  // Without `all`: check what this version needs, the cheapest chain to it
  // (plan.h); default: the newest version. When an object on that chain is
  // bad, the next cheapest chain that avoids it is tried, so the report says
  // whether the version is still reachable.
  std::optional<uint64_t> version;
  // Every version and every object: each anchor is hashed from its own bytes
  // and each delta (step or cumulative, on the cheapest path or not) is
  // replayed from its verified base.
  bool all = false;
  int threads = 0;  // 0 = hardware concurrency
};

// An object that failed a check (a weight object, or a side file object
// "ds/files/..." whose reason names the file), or (VerifyReport::unchecked) one whose bytes
// are good but whose base could not be reached to replay it.
struct ObjectProblem {
  uint64_t version = 0;  // the version whose listing holds the object
  std::string key;
  ErrorCode code = ErrorCode::kOk;  // kNotFound: missing; kIntegrity: size, hash or state hash; kCorruption: format
  std::string reason;               // the failed check, for a person
};

struct VerifyReport {
  std::string bucket;            // Store::Describe()
  std::vector<uint64_t> targets;  // the version asked for, or (all) every version
  // Versions reached with their state hash checked, ascending: the chain to
  // the target, or (all) every reachable version.
  std::vector<uint64_t> verified;
  // Targets that no chain of good objects reaches, ascending.
  std::vector<uint64_t> unreachable;
  // In manifest order. A side file object is checked once, for the set each
  // target resolves to (Manifest::FilesAt), and reported once per version
  // whose `files` lists it; it makes no version unreachable.
  std::vector<ObjectProblem> bad_objects;
  std::vector<ObjectProblem> unchecked;    // all only: deltas from an unreachable base (bytes good)
  // Recovered versions the manifest lists (VersionEntry::changed_elements
  // unknown: anchor-only, published without a base), ascending. Information,
  // not a problem.
  std::vector<uint64_t> recovered;
  uint64_t objects_checked = 0;            // distinct objects (side files too) downloaded and checked
  uint64_t bytes_downloaded = 0;

  // No bad object and every target reachable.
  bool ok() const { return bad_objects.empty() && unreachable.empty(); }
};

// Verifies `store`. A bad or missing object is reported, not returned as an
// error; errors are what prevents checking at all: no or an invalid manifest,
// options.version not listed (kNotFound), a store failure (kIOError).
Result<VerifyReport> VerifyBucket(Store& store, const VerifyOptions& options = {});

}  // namespace deltasync
