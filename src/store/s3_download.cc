// S3Store reads: Get, GetRange, GetVersioned.
//
// One ranged GET of part_size bytes comes first: small objects (manifests,
// most deltas) arrive in that single request, and for large ones its
// Content-Range gives the total size. The rest is then fetched as parallel
// ranged GETs written straight into one buffer. Every later range carries
// If-Match with the first answer's ETag, so an object replaced meanwhile
// makes the download start over instead of mixing two versions. The bytes
// land in a BlobBuffer (anonymous pages, never zero-filled) that becomes the
// returned Blob: curl's writes are the only copy (the parallel parts' with
// non-temporal stores: s3_http.cc, common/stream_copy.h).

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>

#include "common/parallel.h"
#include "deltasync/s3_store.h"
#include "store/s3_client.h"
#include "store/s3_fields.h"

namespace deltasync {
namespace {

using s3::HttpResponse;
using s3::S3Call;
using s3::S3Client;

// A download that saw the object change under it is tried this many times.
constexpr int kMaxRounds = 3;

std::string RangeHeader(uint64_t first, uint64_t end) {  // [first, end)
  return "bytes=" + std::to_string(first) + "-" + std::to_string(end - 1);
}

struct Fetched {
  BlobBuffer bytes;
  std::string etag;
};

Status RangeTooLong(const S3Client& c, const std::string& object, uint64_t offset, uint64_t end,
                    std::optional<uint64_t> total) {
  return Status::InvalidArgument(c.Url(object) + ": range [" + std::to_string(offset) + ", " +
                                 std::to_string(end) + ") exceeds the object" +
                                 (total ? " (" + std::to_string(*total) + " bytes)" : ""));
}

// A zero-length read still has to prove the object exists and the offset
// lies within it.
Result<Fetched> FetchEmpty(S3Client& c, const std::string& object, uint64_t offset) {
  S3Call head{"HEAD", object};
  HttpResponse r = c.Send(head);
  if (!r.ok()) return c.Error(head, r);
  DS_ASSIGN_OR_RETURN(uint64_t size, c.ContentLength(object, r));
  if (offset > size) return RangeTooLong(c, object, offset, offset, size);
  return Fetched{{}, r.Header("etag")};
}

// Keeps [offset, end) of a whole object fetched into out.bytes.
void KeepRange(Fetched& out, uint64_t offset, uint64_t end) {
  if (offset > 0) std::memmove(out.bytes.data(), out.bytes.data() + offset, end - offset);
  (void)out.bytes.Resize(end - offset);  // a shrink: cannot fail
}

// [offset, end) of an object of `total` bytes in one GET: for a server that
// sends no ETag, whose ranges cannot be pinned to one version of the object.
Result<Fetched> FetchInOneGet(S3Client& c, const std::string& object, uint64_t offset, uint64_t end,
                              uint64_t total) {
  Fetched out{BlobBuffer(c.download_pool()), {}};
  S3Call all{"GET", object};
  if (offset > 0 || end < total) all.headers = {{"range", RangeHeader(offset, end)}};
  all.grow_into = &out.bytes;
  HttpResponse r = c.Send(all);
  if (!r.ok()) return c.Error(all, r);
  std::optional<s3::ContentRange> cr;
  if (r.status == 200 && out.bytes.size() == total) {
    KeepRange(out, offset, end);  // the whole object (no range asked, or a server that ignores Range)
  } else if (r.status != 206 || !(cr = s3::ParseContentRange(r.Header("content-range"))) || cr->first != offset ||
             cr->last + 1 != end || cr->total != total || out.bytes.size() != end - offset) {
    return Status::IOError(c.Url(object) + ": GET " + RangeHeader(offset, end) + " (in one request: the server "
                           "sends no ETag to pin ranges to): got " + std::to_string(out.bytes.size()) +
                           " bytes, HTTP " + std::to_string(r.status) + ", Content-Range '" +
                           r.Header("content-range") + "' at " + c.EndpointDescription());
  }
  return out;
}

// Fetches [offset, offset + length) (to the end when length is unset) once.
// Sets *changed when the object was replaced mid-way (the caller retries).
Result<Fetched> FetchOnce(S3Client& c, const std::string& object, uint64_t offset,
                          std::optional<uint64_t> length, bool* changed) {
  const uint64_t chunk = std::max<uint64_t>(c.options().part_size, 1);
  if (length && *length == 0) return FetchEmpty(c, object, offset);
  uint64_t first_len = length ? std::min(*length, chunk) : chunk;

  Fetched out{BlobBuffer(c.download_pool()), {}};
  S3Call first{"GET", object};
  first.headers = {{"range", RangeHeader(offset, offset + first_len)}};
  first.grow_into = &out.bytes;
  HttpResponse r = c.Send(first);
  if (r.transport_error == 0 && r.status == 416) {
    // S3 refuses every range of an empty object: read it whole instead.
    if (offset == 0 && !length) {
      S3Call whole{"GET", object};
      whole.grow_into = &out.bytes;
      r = c.Send(whole);
      if (!r.ok()) return c.Error(whole, r);
      out.etag = r.Header("etag");
      return out;
    }
    return RangeTooLong(c, object, offset, offset + first_len, s3::ParseUnsatisfiedRange(r.Header("content-range")));
  }
  if (!r.ok()) return c.Error(first, r);
  out.etag = r.Header("etag");

  if (r.status == 200) {
    // The whole object (a server that ignores Range): cut out what was asked.
    uint64_t total = out.bytes.size();
    uint64_t end = length ? offset + *length : total;
    if (offset > total || end > total) return RangeTooLong(c, object, offset, end, total);
    KeepRange(out, offset, end);
    return out;
  }
  std::optional<s3::ContentRange> cr = s3::ParseContentRange(r.Header("content-range"));
  if (!cr || cr->first != offset || out.bytes.size() != cr->last - cr->first + 1) {
    return Status::IOError(c.Url(object) + ": GET: malformed partial answer (Content-Range '" +
                           r.Header("content-range") + "', " + std::to_string(out.bytes.size()) +
                           " bytes) at " + c.EndpointDescription());
  }
  uint64_t end = length ? offset + *length : cr->total;
  if (end > cr->total) return RangeTooLong(c, object, offset, end, cr->total);
  uint64_t got = out.bytes.size();
  if (offset + got >= end) return out;
  // The later ranges are pinned to this answer's ETag; without one a
  // replaced object could not be told from the one begun, so the slower
  // exact route: the whole range in one GET (one answer is one version).
  if (out.etag.empty()) return FetchInOneGet(c, object, offset, end, cr->total);

  // Large: the first part's buffer grows to hold everything (its pages are
  // remapped, not copied; the rest is never zero-filled) and the rest is
  // fetched in parallel straight into it. Its fresh pages are not faulted in
  // ahead: each GET's thread faults its own part's huge pages while the
  // network is busy (faulting them in first, even from all threads, delayed
  // the GETs and measured slower).
  if (!out.bytes.Resize(end - offset)) {
    return Status::IOError(c.Url(object) + ": cannot allocate " + std::to_string(end - offset) +
                           " bytes for the download");
  }
  uint8_t* const all = out.bytes.data();
  const uint64_t rest_begin = offset + got;
  const size_t n = static_cast<size_t>((end - rest_begin + chunk - 1) / chunk);
  std::atomic<bool> stop{false};
  // Set by any part's thread (several may see the new object at once), read
  // after they all finished.
  std::atomic<bool> replaced_seen{false};
  std::mutex mu;
  Status failure;
  ParallelFor(n, c.options().parallelism, [&](size_t i) {
    if (stop.load()) return;
    uint64_t lo = rest_begin + i * chunk;
    uint64_t hi = std::min(lo + chunk, end);
    S3Call part{"GET", object};
    part.headers = {{"range", RangeHeader(lo, hi)}, {"if-match", out.etag}};
    part.into = MutableByteSpan(all + (lo - offset), hi - lo);
    HttpResponse pr = c.Send(part);
    Status st;
    // A server that ignores If-Match answers with the new ETag instead of 412.
    const std::string part_etag = pr.ok() ? pr.Header("etag") : std::string();
    const bool replaced = pr.ok() && !part_etag.empty() && part_etag != out.etag;
    std::optional<s3::ContentRange> pcr;
    if (pr.transport_error == 0 && (pr.status == 412 || replaced)) {
      replaced_seen.store(true);
      st = Status::Conflict(c.Url(object) + ": replaced while being downloaded");
    } else if (pr.ok() && part_etag.empty()) {
      st = Status::IOError(c.Url(object) + ": GET " + RangeHeader(lo, hi) +
                           ": answered without an ETag, so it cannot be pinned to the version begun (at " +
                           c.EndpointDescription() + ")");
    } else if (!pr.ok()) {
      st = c.Error(part, pr);
    } else if (pr.status != 206 || pr.sink_bytes != hi - lo) {
      st = Status::IOError(c.Url(object) + ": GET " + RangeHeader(lo, hi) + ": got " +
                           std::to_string(pr.sink_bytes) + " bytes (HTTP " + std::to_string(pr.status) + ")");
    } else if (!(pcr = s3::ParseContentRange(pr.Header("content-range"))) || pcr->first != lo || pcr->last != hi - 1 ||
               pcr->total != cr->total) {
      // The right length for another range (a proxy mixing up its entries).
      st = Status::IOError(c.Url(object) + ": GET " + RangeHeader(lo, hi) + ": answered with Content-Range '" +
                           pr.Header("content-range") + "' at " + c.EndpointDescription());
    }
    if (!st.ok()) {
      stop.store(true);
      std::lock_guard<std::mutex> lock(mu);
      if (failure.ok()) failure = st;
    }
  });
  *changed = replaced_seen.load();
  if (!failure.ok()) return failure;
  return out;
}

Result<Fetched> Fetch(S3Client& c, const std::string& object, uint64_t offset, std::optional<uint64_t> length) {
  for (int round = 1;; ++round) {
    bool changed = false;
    Result<Fetched> r = FetchOnce(c, object, offset, length, &changed);
    if (!changed) return r;
    if (round == kMaxRounds) {
      return Status::IOError(c.Url(object) + ": the object was replaced during each of " +
                             std::to_string(kMaxRounds) + " download attempts");
    }
  }
}

}  // namespace

Result<Blob> S3Store::Get(std::string_view key) {
  DS_ASSIGN_OR_RETURN(std::string object, client_->ObjectKey(key));
  DS_ASSIGN_OR_RETURN(Fetched f, Fetch(*client_, object, 0, std::nullopt));
  return Blob::FromBuffer(std::move(f.bytes));
}

Result<Blob> S3Store::GetRange(std::string_view key, uint64_t offset, uint64_t length) {
  DS_ASSIGN_OR_RETURN(std::string object, client_->ObjectKey(key));
  if (length > UINT64_MAX - offset) {
    return Status::InvalidArgument(client_->Url(object) + ": range offset + length overflows");
  }
  DS_ASSIGN_OR_RETURN(Fetched f, Fetch(*client_, object, offset, length));
  return Blob::FromBuffer(std::move(f.bytes));
}

Result<Store::Versioned> S3Store::GetVersioned(std::string_view key) {
  DS_ASSIGN_OR_RETURN(std::string object, client_->ObjectKey(key));
  DS_ASSIGN_OR_RETURN(Fetched f, Fetch(*client_, object, 0, std::nullopt));
  if (f.etag.empty()) {
    return Status::IOError(client_->Url(object) + ": the server sent no ETag, which conditional writes need");
  }
  return Versioned{Blob::FromBuffer(std::move(f.bytes)), std::move(f.etag)};
}

}  // namespace deltasync
