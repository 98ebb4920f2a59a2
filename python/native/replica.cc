// deltasync._native.Replica: deltasync::Replica (track_changes on) over a
// bucket URL, with zero-copy read-only views of its tensors.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "deltasync/hf_folder.h"
#include "deltasync/replica.h"
#include "deltasync/side_files.h"
#include "deltasync/store.h"

namespace deltasync::py {
namespace {

nb::dict UpdateStatsToDict(const UpdateStats& s) {
  nb::dict d;
  d["from_version"] = s.from_version;
  d["to_version"] = s.to_version;
  d["anchors_applied"] = s.anchors_applied;
  d["deltas_applied"] = s.deltas_applied;
  d["bytes_downloaded"] = s.bytes_downloaded;
  d["download_ms"] = s.download_ms;
  d["apply_ms"] = s.apply_ms;
  d["compact_applies"] = s.compact_applies;
  d["held_applies"] = s.held_applies;
  d["stale_applies"] = s.stale_applies;
  return d;
}

// What keeps the memory under the views of one tensors() call: the replica
// (its current state) and the slot that receives that state if an update
// replaces it (an anchor of another layout). Destroyed with the GIL held (the
// capsule's destructor); the slot is written only under the replica's mutex,
// and only while it is the replica's current one (which the replica keeps).
struct ViewKeeper {
  nb::object replica;
  std::shared_ptr<std::vector<WeightState>> replaced;
};

class PyReplica {
 public:
  PyReplica(const std::string& bucket, int threads) {
    Result<std::shared_ptr<Store>> store =
        WithoutGil(mu_, [&] { return OpenStore(bucket, /*create=*/false, /*create_bucket=*/false); });
    ThrowIfError(store.status());
    ReplicaOptions options;
    options.threads = threads;
    options.track_changes = true;
    options.keep_replaced_states = true;  // freed by KeepReplaced once no view is left
    store_ = std::move(*store);
    replica_ = Replica::Create(store_, options);
  }

  // The held version as a model folder (WriteReplicaFolder).
  void SaveHfDir(const std::string& path, uint64_t max_shard_bytes, bool force) {
    HfWriteOptions options;
    options.max_shard_bytes = max_shard_bytes;
    options.replace = force;
    Status s = WithoutGil(mu_, [&] { return WriteReplicaFolder(*store_, *replica_, path, options); });
    ThrowIfError(s);
  }

  // Moves to `target` (newest when None); returns the UpdateStats as a dict.
  nb::dict Update(std::optional<uint64_t> target) {
    Result<UpdateStats> stats = WithoutGil(mu_, [&] {
      Result<UpdateStats> r = replica_->Update(target);
      KeepReplaced();
      return r;
    });
    ThrowIfError(stats.status());
    return UpdateStatsToDict(*stats);
  }

  // [{key, version, kind, reason}]: Replica::bad_objects(), routed around.
  nb::list BadObjects() {
    std::vector<BadObject> bad = WithoutGil(mu_, [&] { return replica_->bad_objects(); });
    nb::list out;
    for (const BadObject& b : bad) {
      std::string kind(ErrorCodeName(b.code));
      std::replace(kind.begin(), kind.end(), ' ', '_');
      nb::dict d;
      d["key"] = b.key;
      d["version"] = b.version;
      d["kind"] = kind;
      d["reason"] = b.reason;
      out.append(d);
    }
    return out;
  }

  uint64_t Version() {
    return WithoutGil(mu_, [&] { return replica_->version(); });
  }

  std::string StateHashHex() {
    return WithoutGil(mu_, [&] { return replica_->state_hash().Hex(); });
  }

  // The newest version the manifest lists (re-reads it), 0 when none.
  uint64_t LatestAvailable() {
    Result<uint64_t> latest = WithoutGil(mu_, [&]() -> Result<uint64_t> {
      Status s = replica_->Refresh();
      if (!s.ok()) return s;
      const VersionEntry* e = replica_->manifest().Latest();
      return e ? e->version : 0;
    });
    ThrowIfError(latest.status());
    return *latest;
  }

  // [(name, dtype name, read-only array)]: views of the held state that keep
  // this object alive; their contents change on update(), or, when an update
  // replaced the state (an anchor of another layout), they keep the old
  // buffers (and contents) alive until the last of them is gone.
  nb::list Tensors(nb::handle self, const std::string& framework) {
    const bool torch = ParseFramework(framework);
    std::shared_ptr<std::vector<WeightState>> slot;
    std::vector<StateItem> items = WithoutGil(mu_, [&] {
      slot = views_of_state_;  // the pointers and their slot read together
      return StateItems(replica_->state());
    });
    auto* keeper = new ViewKeeper{nb::borrow(self), std::move(slot)};
    nb::capsule owner(keeper, [](void* p) noexcept { delete static_cast<ViewKeeper*>(p); });
    return ExportItems(items, owner, torch);
  }

  void Verify() {
    Status s = WithoutGil(mu_, [&] { return replica_->Verify(); });
    ThrowIfError(s);
  }

  // (everything, {name: uint64 flat indices}) = Replica::TakeChanges(); the
  // index arrays own their memory (moved out of the C++ record, not copied).
  nb::tuple TakeChanges() {
    ChangedElements changed = WithoutGil(mu_, [&] { return replica_->TakeChanges(); });
    nb::dict d;
    for (auto& [name, indices] : changed.tensors) {
      auto* owned = new std::vector<uint64_t>(std::move(indices));
      nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<uint64_t>*>(p); });
      size_t n = owned->size();
      nb::ndarray<nb::numpy, nb::ro, uint64_t> a(owned->data(), 1, &n, owner);
      d[nb::str(name.c_str(), name.size())] = a.cast(nb::rv_policy::reference);
    }
    return nb::make_tuple(changed.everything, d);
  }

 private:
  // An update that loaded an anchor of another layout replaced the state: its
  // buffers go to the views handed out of it (freed with the last of them,
  // at once when there is none), and later views get a fresh slot.
  // REQUIRES: mu_ held (any GIL state).
  void KeepReplaced() {
    std::vector<WeightState> replaced = replica_->TakeReplacedStates();
    if (replaced.empty()) return;
    for (WeightState& s : replaced) views_of_state_->push_back(std::move(s));
    views_of_state_ = std::make_shared<std::vector<WeightState>>();
  }

  std::mutex mu_;
  std::shared_ptr<Store> store_;
  std::unique_ptr<Replica> replica_;
  // The slot that the current state goes to when replaced (ViewKeeper); under mu_.
  std::shared_ptr<std::vector<WeightState>> views_of_state_ = std::make_shared<std::vector<WeightState>>();
};

}  // namespace

void BindReplica(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<PyReplica>(m, "Replica")
      .def(nb::init<const std::string&, int>(), "bucket"_a, "threads"_a)
      .def("update", &PyReplica::Update, "version"_a = nb::none())
      .def_prop_ro("version", &PyReplica::Version)
      .def_prop_ro("bad_objects", &PyReplica::BadObjects)
      .def_prop_ro("state_hash", &PyReplica::StateHashHex)
      .def("latest_available", &PyReplica::LatestAvailable)
      .def(
          "tensors",
          [](nb::handle self, const std::string& framework) {
            return nb::cast<PyReplica&>(self).Tensors(self, framework);
          },
          "framework"_a = "numpy")
      .def("take_changes", &PyReplica::TakeChanges)
      .def("verify", &PyReplica::Verify)
      .def("save_hf_dir", &PyReplica::SaveHfDir, "path"_a, "max_shard_bytes"_a, "force"_a);
}

}  // namespace deltasync::py
