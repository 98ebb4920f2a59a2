#include "store/s3_xml.h"

#include <cstdint>

namespace deltasync::s3 {
namespace {

// Appends code point `cp` as UTF-8; false for values that are not characters.
bool AppendUtf8(uint32_t cp, std::string& out) {
  if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return true;
}

// Decodes the reference body between '&' and ';' ("amp", "#38", "#x26").
bool DecodeReference(std::string_view ref, std::string& out) {
  if (ref == "amp") { out += '&'; return true; }
  if (ref == "lt") { out += '<'; return true; }
  if (ref == "gt") { out += '>'; return true; }
  if (ref == "quot") { out += '"'; return true; }
  if (ref == "apos") { out += '\''; return true; }
  if (ref.size() < 2 || ref[0] != '#') return false;
  bool hex = ref[1] == 'x' || ref[1] == 'X';
  std::string_view digits = ref.substr(hex ? 2 : 1);
  if (digits.empty() || digits.size() > 8) return false;
  uint32_t cp = 0;
  for (char c : digits) {
    uint32_t d;
    if (c >= '0' && c <= '9') d = static_cast<uint32_t>(c - '0');
    else if (hex && c >= 'a' && c <= 'f') d = static_cast<uint32_t>(c - 'a' + 10);
    else if (hex && c >= 'A' && c <= 'F') d = static_cast<uint32_t>(c - 'A' + 10);
    else return false;
    cp = cp * (hex ? 16 : 10) + d;
  }
  return AppendUtf8(cp, out);
}

// A CDATA section, comment or processing instruction starting at text[i]
// ('<'): its length up to and including its end ("]]>", "-->", "?>"); the
// rest of the text when it never ends; 0 when text[i] starts none of them.
// Its characters are never markup: "<![CDATA[</Key>]]>" holds no end tag.
constexpr std::string_view kCdataOpen = "<![CDATA[";

size_t SectionLength(std::string_view text, size_t i) {
  std::string_view rest = text.substr(i);
  std::string_view end;
  size_t skip = 0;
  if (rest.substr(0, kCdataOpen.size()) == kCdataOpen) {
    end = "]]>";
    skip = kCdataOpen.size();
  } else if (rest.substr(0, 4) == "<!--") {
    end = "-->";
    skip = 4;
  } else if (rest.substr(0, 2) == "<?") {
    end = "?>";
    skip = 2;
  } else {
    return 0;
  }
  size_t at = rest.find(end, skip);
  return at == std::string_view::npos ? rest.size() : at + end.size();
}

// The first `needle` ("<tag" or "</tag>") at or after `pos` that is markup,
// not inside a CDATA section, comment or processing instruction; npos when
// there is none (a section that never ends hides everything after it).
size_t FindMarkup(std::string_view xml, size_t pos, std::string_view needle) {
  while (pos < xml.size()) {
    size_t lt = xml.find('<', pos);
    if (lt == std::string_view::npos) return std::string_view::npos;
    if (size_t len = SectionLength(xml, lt)) {
      pos = lt + len;
      continue;
    }
    if (xml.substr(lt, needle.size()) == needle) return lt;
    pos = lt + 1;
  }
  return std::string_view::npos;
}

}  // namespace

std::vector<std::string_view> XmlElements(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> out;
  const std::string open = std::string("<").append(tag);
  const std::string close = std::string("</").append(tag).append(">");
  size_t pos = 0;
  while (pos < xml.size()) {
    size_t start = FindMarkup(xml, pos, open);
    if (start == std::string_view::npos) break;
    size_t after = start + open.size();
    // "<Key" must not match "<KeyCount>": the name has to end here.
    if (after >= xml.size()) break;
    char c = xml[after];
    if (c != '>' && c != ' ' && c != '/' && c != '\t' && c != '\r' && c != '\n') {
      pos = after;
      continue;
    }
    size_t gt = xml.find('>', after);
    if (gt == std::string_view::npos) break;
    if (xml[gt - 1] == '/') {  // <tag/>
      out.emplace_back();
      pos = gt + 1;
      continue;
    }
    size_t end = FindMarkup(xml, gt + 1, close);
    if (end == std::string_view::npos) break;
    out.push_back(xml.substr(gt + 1, end - gt - 1));
    pos = end + close.size();
  }
  return out;
}

std::optional<std::string> XmlText(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> all = XmlElements(xml, tag);
  if (all.empty()) return std::nullopt;
  return XmlUnescape(all.front());
}

std::string XmlUnescape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '<') {
      if (size_t len = SectionLength(text, i)) {
        if (text.substr(i, kCdataOpen.size()) == kCdataOpen) {  // the characters, verbatim
          size_t body = i + kCdataOpen.size();
          size_t end = text.find("]]>", body);
          out.append(text.substr(body, (end == std::string_view::npos ? text.size() : end) - body));
        }  // a comment or a processing instruction is no text
        i += len - 1;
        continue;
      }
    }
    if (text[i] != '&') {
      out += text[i];
      continue;
    }
    size_t semi = text.find(';', i + 1);
    // References are short; a far-away ';' belongs to something else.
    if (semi != std::string_view::npos && semi - i <= 12 &&
        DecodeReference(text.substr(i + 1, semi - i - 1), out)) {
      i = semi;
    } else {
      out += '&';
    }
  }
  return out;
}

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace deltasync::s3
