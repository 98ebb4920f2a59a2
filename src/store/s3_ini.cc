// ParseIni: the subset of Python's configparser that ~/.aws/credentials and
// ~/.aws/config use, so a file the AWS CLI accepts means the same here.
#include <string>

#include "store/s3_config.h"
#include "store/s3_signer.h"

namespace deltasync::s3 {
namespace {

std::string_view Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\r')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return s.substr(b, e - b);
}

}  // namespace

Result<IniFile> ParseIni(std::string_view text, std::string_view label) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // UTF-8 BOM (Windows editors)
  IniFile file;
  IniSection* section = nullptr;
  std::string last_key;      // the key an indented line belongs to
  bool last_key_nests = false;  // last key had an empty value: indented lines are sub-keys
  size_t line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view raw = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    auto error = [&](std::string_view what) {
      return Status::InvalidArgument(std::string(label) + ":" + std::to_string(line_no) + ": " +
                                     std::string(what));
    };

    std::string_view line = Trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    bool indented = raw[0] == ' ' || raw[0] == '\t';

    if (line.front() == '[') {
      if (line.back() != ']') return error("section header without closing ']'");
      std::string name(Trim(line.substr(1, line.size() - 2)));
      if (name.empty()) return error("empty section name");
      section = &file[name];
      last_key.clear();
      continue;
    }
    if (section == nullptr) return error("a key before any [section]");

    size_t eq = line.find_first_of("=:");
    if (indented && !last_key.empty() && (!last_key_nests || eq == std::string_view::npos)) {
      // configparser: an indented line continues the previous value.
      std::string& value = (*section)[last_key];
      value += value.empty() ? "" : "\n";
      value += line;
      continue;
    }
    if (eq == std::string_view::npos) return error("expected 'key = value'");
    std::string key = AsciiLower(Trim(line.substr(0, eq)));
    if (key.empty()) return error("empty key");
    std::string value(Trim(line.substr(eq + 1)));

    if (indented && last_key_nests) {
      (*section)[last_key + "." + key] = value;  // AWS nested form: "s3 =" then indented keys
      continue;
    }
    (*section)[key] = value;
    last_key = key;
    last_key_nests = value.empty();
  }
  return file;
}

}  // namespace deltasync::s3
