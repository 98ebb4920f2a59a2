// deltasync._native.PartPublisher / PartCommitter: one rank's part of a
// parted version, and the commit (include/deltasync/part_publisher.h).
// Python's deltasync.torch sharded attach (python/deltasync/_sharded.py)
// drives them across the ranks of a torch.distributed job.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "deltasync/part_publisher.h"
#include "deltasync/store.h"

namespace deltasync::py {
namespace {

using TensorItem = std::tuple<std::string, std::string, std::vector<uint64_t>>;                 // name, dtype, shape
using BlockItem = std::tuple<uint32_t, std::vector<uint64_t>, std::vector<uint64_t>>;            // tensor, offset, shape

PartLayout MakeLayout(const std::vector<TensorItem>& tensors, const std::vector<std::vector<BlockItem>>& parts) {
  PartLayout l;
  for (const auto& [name, dtype, shape] : tensors) {
    std::optional<DType> dt = ParseDType(dtype);
    if (!dt) Raise(ErrorCode::kInvalidArgument, "tensor '" + name + "': unknown dtype " + dtype);
    l.tensors.push_back({name, *dt, shape});
  }
  for (const auto& part : parts) {
    std::vector<Block>& blocks = l.parts.emplace_back();
    for (const auto& [tensor, offset, shape] : part) blocks.push_back({tensor, offset, shape});
  }
  ThrowIfError(l.Validate());
  return l;
}

PublisherOptions Options(std::optional<uint64_t> anchor_interval, int threads, bool allow_nonfinite,
                         bool allow_version_jump) {
  PublisherOptions o;
  o.anchor_interval = anchor_interval;
  o.threads = threads;
  o.allow_nonfinite = allow_nonfinite;
  o.allow_version_jump = allow_version_jump;
  return o;
}

class PyPartPublisher {
 public:
  PyPartPublisher(const std::string& bucket, const std::vector<TensorItem>& tensors,
                  const std::vector<std::vector<BlockItem>>& parts, uint32_t part,
                  std::optional<uint64_t> anchor_interval, int threads, bool allow_nonfinite,
                  bool allow_version_jump, bool create_bucket) {
    PartLayout layout = MakeLayout(tensors, parts);
    PublisherOptions options = Options(anchor_interval, threads, allow_nonfinite, allow_version_jump);
    Result<std::unique_ptr<PartPublisher>> opened = WithoutGil(mu_, [&]() -> Result<std::unique_ptr<PartPublisher>> {
      DS_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(bucket, /*create=*/true, create_bucket));
      return PartPublisher::Open(std::move(store), std::move(layout), part, std::move(options));
    });
    ThrowIfError(opened.status());
    pub_ = std::move(*opened);
  }

  // items: (full tensor name, block array, dtype override or ""). Returns the
  // receipt's wire form.
  std::string Publish(uint64_t version, const std::vector<std::tuple<std::string, nb::object, std::string>>& items) {
    std::vector<BorrowedTensor> borrowed;
    borrowed.reserve(items.size());
    for (const auto& [name, obj, dtype] : items) borrowed.push_back(ImportTensor(name, obj, dtype));
    std::vector<TensorView> views;
    for (const BorrowedTensor& b : borrowed) views.push_back(b.view);
    Result<PartReceipt> r = WithoutGil(mu_, [&] { return pub_->Publish(version, views); });
    ThrowIfError(r.status());
    return r->Serialize();
  }

  void Finish(bool committed, std::optional<std::string> manifest_token) {
    WithoutGil(mu_, [&] { pub_->Finish(committed, std::move(manifest_token)); });
  }
  uint64_t LatestVersion() {
    return WithoutGil(mu_, [&] { return pub_->latest_version(); });
  }
  std::string PartHash() {
    return WithoutGil(mu_, [&] { return pub_->part_hash().Hex(); });
  }

 private:
  std::mutex mu_;
  std::unique_ptr<PartPublisher> pub_;
};

class PyPartCommitter {
 public:
  PyPartCommitter(const std::string& bucket, const std::vector<TensorItem>& tensors,
                  const std::vector<std::vector<BlockItem>>& parts, std::optional<uint64_t> anchor_interval,
                  bool allow_version_jump, bool create_bucket) {
    PartLayout layout = MakeLayout(tensors, parts);
    PublisherOptions options = Options(anchor_interval, 0, false, allow_version_jump);
    Result<std::unique_ptr<PartCommitter>> opened = WithoutGil(mu_, [&]() -> Result<std::unique_ptr<PartCommitter>> {
      DS_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(bucket, /*create=*/true, create_bucket));
      return PartCommitter::Open(std::move(store), std::move(layout), std::move(options));
    });
    ThrowIfError(opened.status());
    committer_ = std::move(*opened);
  }

  // receipts: their wire forms. Returns the version's stats (as Publisher.publish).
  nb::dict Commit(uint64_t version, const std::vector<std::string>& receipts) {
    Result<PublishStats> stats = WithoutGil(mu_, [&]() -> Result<PublishStats> {
      std::vector<PartReceipt> parsed;
      for (const std::string& r : receipts) {
        DS_ASSIGN_OR_RETURN(PartReceipt p, PartReceipt::Parse(r));
        parsed.push_back(std::move(p));
      }
      return committer_->Commit(version, parsed);
    });
    ThrowIfError(stats.status());
    nb::dict d;
    d["version"] = stats->version;
    d["wrote_anchor"] = stats->wrote_anchor;
    d["wrote_delta"] = stats->wrote_delta;
    d["total_elements"] = stats->total_elements;
    d["changed_elements"] = stats->changed_elements;
    d["delta_bytes"] = stats->delta_bytes;
    d["anchor_bytes"] = stats->anchor_bytes;
    d["state_hash"] = stats->state_hash.Hex();
    d["commit_ms"] = stats->upload_ms;
    return d;
  }

  uint64_t LatestVersion() {
    return WithoutGil(mu_, [&] { return committer_->latest_version(); });
  }
  // The token of the manifest it last read or wrote (for the ranks' finish).
  std::optional<std::string> ManifestToken() {
    return WithoutGil(mu_, [&] { return committer_->manifest_token(); });
  }

 private:
  std::mutex mu_;
  std::unique_ptr<PartCommitter> committer_;
};

}  // namespace

void BindParts(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<PyPartPublisher>(m, "PartPublisher")
      .def(nb::init<const std::string&, const std::vector<TensorItem>&, const std::vector<std::vector<BlockItem>>&,
                    uint32_t, std::optional<uint64_t>, int, bool, bool, bool>(),
           "bucket"_a, "tensors"_a, "parts"_a, "part"_a, "anchor_interval"_a.none(), "threads"_a, "allow_nonfinite"_a,
           "allow_version_jump"_a, "create_bucket"_a)
      .def("publish", &PyPartPublisher::Publish, "version"_a, "items"_a)
      .def("finish", &PyPartPublisher::Finish, "committed"_a, "manifest_token"_a = nb::none())
      .def_prop_ro("latest_version", &PyPartPublisher::LatestVersion)
      .def_prop_ro("part_hash", &PyPartPublisher::PartHash);
  nb::class_<PyPartCommitter>(m, "PartCommitter")
      .def(nb::init<const std::string&, const std::vector<TensorItem>&, const std::vector<std::vector<BlockItem>>&,
                    std::optional<uint64_t>, bool, bool>(),
           "bucket"_a, "tensors"_a, "parts"_a, "anchor_interval"_a.none(), "allow_version_jump"_a, "create_bucket"_a)
      .def("commit", &PyPartCommitter::Commit, "version"_a, "receipts"_a)
      .def_prop_ro("latest_version", &PyPartCommitter::LatestVersion)
      .def_prop_ro("manifest_token", &PyPartCommitter::ManifestToken);
}

}  // namespace deltasync::py
