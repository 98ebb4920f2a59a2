// Fuzz target for the XML of an S3 server's answers (src/store/s3_xml.cc,
// s3_listing.cc): ListObjectsV2 and ListMultipartUploads pages, errors,
// multipart answers. Properties, per input:
//   1. arbitrary bytes never crash XmlElements / XmlText / XmlUnescape /
//      ParseListPage / ParseUploadsPage;
//   2. every element XmlElements gives lies inside the input, and decoding
//      never makes text longer (XmlUnescape(t).size() <= t.size());
//   3. XmlUnescape(XmlEscape(s)) == s, for the input and each of its pieces;
//   4. an accepted listing page names a non-empty key for every <Contents>;
//   5. a page written from keys cut out of the input (escaped, or in CDATA
//      sections when they hold no "]]>") lists exactly those keys, in order,
//      with its continuation token.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "store/s3_listing.h"
#include "store/s3_xml.h"

namespace {

using namespace deltasync::s3;

using deltasync::fuzz::Check;

bool Inside(std::string_view part, std::string_view whole) {
  return part.empty() || (part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size());
}

// The input cut at '\n' into non-empty pieces (at most 64).
std::vector<std::string> Pieces(std::string_view in) {
  std::vector<std::string> out;
  while (!in.empty() && out.size() < 64) {
    size_t nl = in.find('\n');
    std::string_view piece = in.substr(0, nl);
    if (!piece.empty()) out.emplace_back(piece);
    in.remove_prefix(nl == std::string_view::npos ? in.size() : nl + 1);
  }
  return out;
}

// A key as a server may write it: escaped, or (odd lengths) in a CDATA section.
std::string Written(const std::string& key) {
  if (key.size() % 2 == 1 && key.find("]]>") == std::string::npos) return "<![CDATA[" + key + "]]>";
  return XmlEscape(key);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view xml(reinterpret_cast<const char*>(data), size);
  for (std::string_view tag : {"ListBucketResult", "Contents", "Key", "Upload", "Error", "Code"}) {
    for (std::string_view e : XmlElements(xml, tag)) {
      Check(Inside(e, xml), "an element lies outside the input");
      Check(XmlUnescape(e).size() <= e.size(), "decoding made the text longer");
    }
  }
  Check(XmlUnescape(xml).size() <= xml.size(), "decoding made the text longer");
  Check(XmlUnescape(XmlEscape(xml)) == xml, "XmlUnescape(XmlEscape(s)) != s");

  deltasync::Result<ListPage> page = ParseListPage(xml);
  if (page.ok()) {
    const std::vector<std::string_view> whole = XmlElements(xml, "ListBucketResult");
    Check(whole.size() == 1, "a page that is not one document was accepted");
    Check(page->keys.size() == XmlElements(whole[0], "Contents").size(), "an entry was dropped or added");
    for (const std::string& k : page->keys) Check(!k.empty(), "an empty key was listed");
  }
  UploadsPage uploads = ParseUploadsPage(xml);
  Check(uploads.uploads.size() <= XmlElements(xml, "Upload").size(), "more uploads than <Upload> elements");
  for (const UploadEntry& u : uploads.uploads) Check(!u.key.empty() && !u.upload_id.empty(), "an upload without key");

  // A page written from the input's pieces lists exactly them.
  std::vector<std::string> keys = Pieces(xml);
  const std::string token = keys.empty() ? std::string() : keys.back();
  std::string written = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult><Name>b</Name>"
                        "<IsTruncated>true</IsTruncated>";
  for (const std::string& k : keys) {
    Check(XmlUnescape(XmlEscape(k)) == k, "XmlUnescape(XmlEscape(s)) != s");
    written += "<Contents><Key>" + Written(k) + "</Key><Size>1</Size></Contents>";
  }
  written += "<NextContinuationToken>" + XmlEscape(token) + "</NextContinuationToken></ListBucketResult>";
  deltasync::Result<ListPage> again = ParseListPage(written);
  Check(again.ok(), "a well-formed page was refused");
  Check(again->keys == keys, "a well-formed page lists other keys");
  Check(again->truncated && again->next_token == token, "the token of a well-formed page was misread");
  return 0;
}
