// deltasync._native.Publisher: deltasync::Publisher over a bucket URL.
// Python's deltasync.Publisher (python/deltasync/_publisher.py) adds the
// background queue, argument normalisation and the PublishResult type.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "deltasync/changes.h"
#include "deltasync/hf_folder.h"
#include "deltasync/patch.h"
#include "deltasync/publisher.h"
#include "deltasync/store.h"

namespace deltasync::py {
namespace {

// Calls unchanged() with the GIL: None -> OK, a string -> kFailedPrecondition
// with it; an exception it raises -> kInternal (it cannot cross the C++ publish).
Status AskUnchanged(const nb::object& unchanged) {
  nb::gil_scoped_acquire gil;
  try {
    nb::object why = unchanged();
    return why.is_none() ? Status::OK() : Status::FailedPrecondition(nb::cast<std::string>(why));
  } catch (const std::exception& e) {
    return Status::Internal(std::string("the unchanged() check raised: ") + e.what());
  }
}

nb::dict StatsToDict(const PublishStats& s) {
  nb::dict d;
  d["version"] = s.version;
  d["wrote_anchor"] = s.wrote_anchor;
  d["wrote_delta"] = s.wrote_delta;
  d["total_elements"] = s.total_elements;
  d["changed_elements"] = s.changed_elements ? nb::cast(*s.changed_elements) : nb::none();
  d["recovered"] = s.recovered;
  d["delta_bytes"] = s.delta_bytes;
  d["anchor_bytes"] = s.anchor_bytes;
  d["cumulative_bytes"] = s.cumulative_bytes;
  d["gap_delta_bytes"] = s.gap_delta_bytes;
  d["full_bytes"] = s.full_bytes;
  d["state_hash"] = s.state_hash.Hex();
  d["detect_encode_ms"] = s.detect_encode_ms;
  d["upload_ms"] = s.upload_ms;
  return d;
}

class PyPublisher {
 public:
  // The four settings: None = the bucket's stored value (or the default).
  PyPublisher(const std::string& bucket, std::optional<uint64_t> anchor_interval,
              const std::optional<std::string>& encoding, std::optional<uint64_t> cumulative_interval,
              std::optional<double> anchor_max_fraction, bool change_settings, bool allow_version_jump, int threads,
              bool allow_nonfinite, bool create_bucket, std::vector<std::string> notify, std::string notify_token,
              bool measure_gap_delta) {
    PublisherOptions options;
    if (encoding) {
      Result<IndexEncoding> enc = ParseEncoding(*encoding);
      ThrowIfError(enc.status());
      options.encoding = *enc;
    }
    options.anchor_interval = anchor_interval;
    options.cumulative_interval = cumulative_interval;
    options.anchor_max_fraction = anchor_max_fraction;
    options.change_settings = change_settings;
    options.allow_version_jump = allow_version_jump;
    options.measure_gap_delta = measure_gap_delta;
    options.allow_nonfinite = allow_nonfinite;
    options.threads = threads;
    options.notify_urls = std::move(notify);
    options.notify_token = std::move(notify_token);
    // Opening reads the bucket (and rebuilds the newest state when it has
    // versions): no GIL needed.
    Result<std::unique_ptr<Publisher>> opened = WithoutGil(mu_, [&]() -> Result<std::unique_ptr<Publisher>> {
      Result<std::shared_ptr<Store>> store = OpenStore(bucket, /*create=*/true, create_bucket);
      if (!store.ok()) return store.status();
      return Publisher::Open(std::move(*store), std::move(options));
    });
    ThrowIfError(opened.status());
    pub_ = std::move(*opened);
  }

  // items: (name, array, dtype override or ""). unchanged: None, or called
  // (with the GIL) once every array was read and before anything is uploaded:
  // a string it returns refuses the version (FailedPreconditionError with that
  // message, nothing committed), None lets it go on.
  nb::dict Publish(uint64_t version, const std::vector<std::tuple<std::string, nb::object, std::string>>& items,
                   const nb::object& unchanged) {
    std::vector<BorrowedTensor> borrowed;  // keeps the arrays alive; destroyed with the GIL held
    borrowed.reserve(items.size());
    for (const auto& [name, obj, dtype] : items) borrowed.push_back(ImportTensor(name, obj, dtype));
    std::vector<TensorView> views;
    views.reserve(borrowed.size());
    for (const BorrowedTensor& b : borrowed) views.push_back(b.view);
    std::function<Status()> check;
    if (!unchanged.is_none()) check = [&unchanged] { return AskUnchanged(unchanged); };
    Result<PublishStats> stats = WithoutGil(mu_, [&] { return pub_->Publish(version, views, std::nullopt, check); });
    ThrowIfError(stats.status());
    return StatsToDict(*stats);
  }

  // A Hugging Face model folder (ReadHfFolder): its shards, mapped, and its
  // side files as the version's set.
  nb::dict PublishDir(uint64_t version, const std::string& path) {
    Result<PublishStats> stats = WithoutGil(mu_, [&]() -> Result<PublishStats> {
      DS_ASSIGN_OR_RETURN(HfFolder folder, ReadHfFolder(path));
      return pub_->PublishFolder(version, folder);
    });
    ThrowIfError(stats.status());
    return StatsToDict(*stats);
  }

  // The published (bf16) form of the arrays, owned: taken in the caller's
  // thread so that a background publish never reads arrays the trainer is
  // changing. Does not wait for a publish in progress (Snapshot only reads
  // the options, which never change).
  std::shared_ptr<WeightState> Snapshot(const std::vector<std::tuple<std::string, nb::object, std::string>>& items) {
    std::vector<BorrowedTensor> borrowed;
    borrowed.reserve(items.size());
    for (const auto& [name, obj, dtype] : items) borrowed.push_back(ImportTensor(name, obj, dtype));
    std::vector<TensorView> views;
    views.reserve(borrowed.size());
    for (const BorrowedTensor& b : borrowed) views.push_back(b.view);
    Result<WeightState> snapshot = [&] {
      nb::gil_scoped_release release;
      return pub_->Snapshot(views);
    }();
    ThrowIfError(snapshot.status());
    return std::make_shared<WeightState>(std::move(*snapshot));
  }

  nb::dict PublishSnapshot(uint64_t version, const std::shared_ptr<WeightState>& snapshot) {
    Result<PublishStats> stats = WithoutGil(mu_, [&] {
      std::vector<TensorView> views = snapshot->views();
      return pub_->Publish(version, views);
    });
    ThrowIfError(stats.status());
    return StatsToDict(*stats);
  }

  // items: (name, flat uint64 indices, values in the published dtype).
  nb::dict PublishChanges(uint64_t version,
                          const std::vector<std::tuple<std::string, nb::object, nb::object>>& items) {
    std::vector<std::string> names;
    for (const auto& item : items) names.push_back(std::get<0>(item));
    std::vector<std::optional<DType>> dtypes = WithoutGil(mu_, [&] {
      std::vector<std::optional<DType>> out;
      for (const std::string& name : names) {
        const WeightState::Tensor* t = pub_->state().Find(name);
        out.push_back(t ? std::optional<DType>(t->dtype) : std::nullopt);
      }
      return out;
    });
    std::vector<TensorChanges> changes;
    changes.reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& [name, idx_obj, val_obj] = items[i];
      BorrowedTensor idx = ImportTensor(name + " (indices)", idx_obj, "");
      if (idx.view.dtype != DType::kU64 || idx.view.shape.size() != 1) {
        Raise(ErrorCode::kInvalidArgument, "tensor '" + name + "': change indices must be a 1-D uint64 array, got " +
                                               std::string(DTypeName(idx.view.dtype)) + " " +
                                               ShapeToString(idx.view.shape));
      }
      BorrowedTensor val = ImportTensor(name + " (values)", val_obj, "");
      const uint64_t count = idx.view.num_elements();
      // Before the first version there is no published dtype: PublishChanges
      // reports that (kFailedPrecondition); unknown names it reports too.
      DType dtype = dtypes[i].value_or(val.view.dtype);
      // The values are taken as the published dtype's bits: an array of that
      // dtype or of the unsigned integer of its width (bf16 as uint16 bits).
      // Any other dtype of the same width (float16 values for a bf16 tensor,
      // int16 numbers) would be reinterpreted, silently: refused.
      const DType v = val.view.dtype;
      const bool raw_bits = (v == DType::kU8 || v == DType::kU16 || v == DType::kU32 || v == DType::kU64) &&
                            DTypeSize(v) == DTypeSize(dtype);
      if (dtypes[i] && v != dtype && !raw_bits) {
        Raise(ErrorCode::kInvalidArgument,
              "tensor '" + name + "': values of " + std::string(DTypeName(v)) + " for the published dtype " +
                  std::string(DTypeName(dtype)) + "; pass " + std::string(DTypeName(dtype)) +
                  " values (or their bits as an unsigned integer array" +
                  (dtype == DType::kBF16 ? "; float32 values are rounded to bf16" : "") + ")");
      }
      if (val.view.data.size() != count * DTypeSize(dtype)) {
        Raise(ErrorCode::kInvalidArgument,
              "tensor '" + name + "': " + std::to_string(count) + " indices need " + std::to_string(count) +
                  " values of the published dtype " + std::string(DTypeName(dtype)) + " (" +
                  std::to_string(count * DTypeSize(dtype)) + " bytes), got " +
                  std::to_string(val.view.num_elements()) + " " + std::string(DTypeName(val.view.dtype)) +
                  " values (" + std::to_string(val.view.data.size()) + " bytes)");
      }
      TensorChanges c;
      c.name = name;
      c.dtype = dtype;
      const uint64_t* ip = reinterpret_cast<const uint64_t*>(idx.view.data.data());
      c.indices.assign(ip, ip + count);
      c.values.assign(val.view.data.begin(), val.view.data.end());
      changes.push_back(std::move(c));
    }
    Result<PublishStats> stats = WithoutGil(mu_, [&] { return pub_->PublishChanges(version, changes); });
    ThrowIfError(stats.status());
    return StatsToDict(*stats);
  }

  uint64_t LatestVersion() {
    return WithoutGil(mu_, [&] { return pub_->latest_version(); });
  }

  // {name: dtype name} of the published state.
  nb::dict PublishedDTypes() {
    std::vector<std::pair<std::string, DType>> out = WithoutGil(mu_, [&] {
      std::vector<std::pair<std::string, DType>> v;
      for (const WeightState::Tensor& t : pub_->state().tensors()) v.emplace_back(t.name, t.dtype);
      return v;
    });
    nb::dict d;
    for (const auto& [name, dtype] : out) d[nb::str(name.c_str(), name.size())] = std::string(DTypeName(dtype));
    return d;
  }

  // [(name, dtype name, read-only array)] over the published snapshot; the
  // arrays keep this object alive and change when a version is published.
  nb::dict Settings() {
    const BucketSettings s = WithoutGil(mu_, [&] { return pub_->settings(); });
    nb::dict d;
    d["encoding"] = std::string(EncodingName(s.encoding));
    d["anchor_interval"] = s.anchor_interval;
    d["cumulative_interval"] = s.cumulative_interval;
    d["anchor_max_fraction"] = s.anchor_max_fraction;
    return d;
  }

  // Publisher::degraded_reason(): "" when not degraded.
  std::string DegradedReason() {
    return WithoutGil(mu_, [&] { return pub_->degraded_reason(); });
  }

  std::vector<std::string> ChangedSettings() {
    return WithoutGil(mu_, [&] { return pub_->changed_settings(); });
  }

  nb::list StateTensors(nb::handle self, const std::string& framework) {
    return ExportState(mu_, pub_->state(), self, framework);
  }

 private:
  std::mutex mu_;
  std::unique_ptr<Publisher> pub_;
};

}  // namespace

void BindPublisher(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<WeightState>(m, "Snapshot", "A published-form copy of a state, owned (Publisher.snapshot).")
      .def_prop_ro("nbytes", [](const WeightState& s) { return s.total_bytes(); });
  nb::class_<PyPublisher>(m, "Publisher")
      .def(nb::init<const std::string&, std::optional<uint64_t>, const std::optional<std::string>&,
                    std::optional<uint64_t>, std::optional<double>, bool, bool, int, bool, bool,
                    std::vector<std::string>, std::string, bool>(),
           "bucket"_a, "anchor_interval"_a.none(), "encoding"_a.none(), "cumulative_interval"_a.none(),
           "anchor_max_fraction"_a.none(), "change_settings"_a, "allow_version_jump"_a, "threads"_a,
           "allow_nonfinite"_a, "create_bucket"_a, "notify"_a, "notify_token"_a, "measure_gap_delta"_a)
      .def_prop_ro("settings", &PyPublisher::Settings)
      .def_prop_ro("changed_settings", &PyPublisher::ChangedSettings)
      .def("publish", &PyPublisher::Publish, "version"_a, "items"_a, "unchanged"_a = nb::none())
      .def("publish_changes", &PyPublisher::PublishChanges, "version"_a, "items"_a)
      .def("publish_dir", &PyPublisher::PublishDir, "version"_a, "path"_a)
      .def("snapshot", &PyPublisher::Snapshot, "items"_a)
      .def("publish_snapshot", &PyPublisher::PublishSnapshot, "version"_a, "snapshot"_a)
      .def_prop_ro("latest_version", &PyPublisher::LatestVersion)
      .def_prop_ro("degraded_reason", &PyPublisher::DegradedReason)
      .def("published_dtypes", &PyPublisher::PublishedDTypes)
      .def(
          "state_tensors",
          [](nb::handle self, const std::string& framework) {
            return nb::cast<PyPublisher&>(self).StateTensors(self, framework);
          },
          "framework"_a = "numpy");
}

}  // namespace deltasync::py
