#include "store/s3_listing.h"

#include "store/s3_fields.h"
#include "store/s3_xml.h"

namespace deltasync::s3 {

Result<ListPage> ParseListPage(std::string_view xml) {
  std::vector<std::string_view> page = XmlElements(xml, "ListBucketResult");
  if (page.size() != 1) return Status::IOError("a listing page is not one whole <ListBucketResult> document");
  ListPage out;
  for (std::string_view contents : XmlElements(page[0], "Contents")) {
    std::optional<std::string> key = XmlText(contents, "Key");
    if (!key || key->empty()) return Status::IOError("a listing entry has no <Key>");
    out.keys.push_back(std::move(*key));
  }
  out.truncated = XmlText(page[0], "IsTruncated").value_or("false") == "true";
  out.next_token = XmlText(page[0], "NextContinuationToken").value_or("");
  return out;
}

UploadsPage ParseUploadsPage(std::string_view xml) {
  UploadsPage out;
  for (std::string_view upload : XmlElements(xml, "Upload")) {
    UploadEntry e{XmlText(upload, "Key").value_or(""), XmlText(upload, "UploadId").value_or(""),
                  ParseIsoTime(XmlText(upload, "Initiated").value_or(""))};
    if (e.key.empty() || e.upload_id.empty()) continue;
    out.uploads.push_back(std::move(e));
  }
  out.truncated = XmlText(xml, "IsTruncated").value_or("false") == "true";
  out.next_key = XmlText(xml, "NextKeyMarker").value_or("");
  out.next_upload_id = XmlText(xml, "NextUploadIdMarker").value_or("");
  return out;
}

}  // namespace deltasync::s3
