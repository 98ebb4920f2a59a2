// Just enough XML for S3's answers (internal): find elements by tag name and
// decode their text. S3 responses are flat, machine-written documents; this
// reads the few tags deltasync needs (Key, UploadId, ETag, Code, ...) and
// never executes anything a document declares (no DTDs, no external
// entities). Input is untrusted: malformed text yields "not found", never a
// crash or an out-of-bounds read.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deltasync::s3 {

// The raw contents of every <tag>...</tag> (or <tag attr="...">...</tag>) in
// `xml`, in document order, without decoding. <tag/> gives "". Elements of
// the same name must not nest (true of every S3 response element used).
// What a CDATA section, comment or processing instruction holds is never
// markup (<![CDATA[</Key>]]> ends no Key); an element whose end tag is never
// found (a section that does not end hides it) is not listed.
std::vector<std::string_view> XmlElements(std::string_view xml, std::string_view tag);

// The decoded text of the first <tag> element; nullopt when there is none.
std::optional<std::string> XmlText(std::string_view xml, std::string_view tag);

// Decodes &amp; &lt; &gt; &quot; &apos; and numeric references (&#38;
// &#x26;, written out as UTF-8); CDATA sections give their characters as
// they are (no reference inside one is decoded); comments and processing
// instructions give nothing. An unknown or malformed reference is kept as it
// is.
std::string XmlUnescape(std::string_view text);

// Escapes & < > " ' for element text and attribute values.
std::string XmlEscape(std::string_view text);

}  // namespace deltasync::s3
