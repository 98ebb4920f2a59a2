// safetensors reader: checks every rule of the format on untrusted bytes.
//
// Three layers, each refusing what it can see: the 8-byte length prefix, a
// strict UTF-8 + JSON pass (SAX, so nesting depth and duplicate keys are
// caught while parsing), then the schema and byte-layout rules on the parsed
// header. The rules and their messages are listed in
// docs/format.md, "safetensors rules"; keep the two in step.
#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "deltasync/safetensors.h"

namespace deltasync {
namespace {

using json = nlohmann::json;

// A valid header nests 3 deep (root -> tensor -> shape). The cap only has to
// stop nesting bombs early; 64 leaves room without costing anything.
constexpr size_t kMaxJsonDepth = 64;

// Long strings from a hostile file should not flood an error message.
constexpr size_t kMaxQuotedBytes = 128;

// 'name' for messages: control bytes escaped, long names cut.
std::string Quote(std::string_view s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMaxQuotedBytes; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > kMaxQuotedBytes) out += "...";
  return out + "'";
}

// "an array", "a number", ... for "X is <type>, not <expected>" messages.
std::string TypeText(const json& v) {
  std::string_view t = v.type_name();
  return (t == "array" || t == "object" ? "an " : "a ") + std::string(t);
}

// A JSON value in a message, cut like Quote().
std::string Show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > kMaxQuotedBytes) s = s.substr(0, kMaxQuotedBytes) + "...";
  return s;
}

// Offset of the first byte that is not part of well-formed UTF-8 (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF), or nullopt.
// nlohmann checks strings too, but it does not see bytes outside strings the
// same way and its messages are not ours, so we check the whole header first.
std::optional<size_t> FirstInvalidUtf8(ByteSpan s) {
  size_t i = 0;
  while (i < s.size()) {
    uint8_t c = s[i];
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong below U+0800
      if (c == 0xED) hi = 0x9F;  // U+D800..U+DFFF are surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong below U+10000
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;  // continuation byte, C0/C1 (overlong) or F5..FF
    }
    if (s.size() - i < len) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
    }
    i += len;
  }
  return std::nullopt;
}

// Builds a json DOM from nlohmann's SAX events, refusing what nlohmann's own
// DOM parser would accept silently: duplicate keys (it keeps the last) and
// deep nesting. Never throws for bad input; the first problem is in error().
class HeaderBuilder {
 public:
  json& root() { return root_; }
  const std::string& error() const { return error_; }

  bool null() { return Add(nullptr); }
  bool boolean(bool v) { return Add(v); }
  bool number_integer(json::number_integer_t v) { return Add(v); }
  bool number_unsigned(json::number_unsigned_t v) { return Add(v); }
  bool number_float(json::number_float_t v, const std::string&) { return Add(v); }
  bool string(std::string& v) { return Add(std::move(v)); }
  bool binary(json::binary_t&) { return Fail("header contains binary data"); }

  bool start_object(size_t) { return Open(json::object()); }
  bool start_array(size_t) { return Open(json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(std::string& k) {
    if (open_.back()->contains(k)) {
      return Fail("duplicate key " + Quote(k) + " in " + where_.back());
    }
    keys_.resize(open_.size());
    keys_.back() = std::move(k);
    return true;
  }

  bool parse_error(size_t position, const std::string&, const json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, ..."
    // The bracketed id means nothing to a reader of our message.
    std::string what = e.what();
    if (size_t p = what.find("] "); p != std::string::npos) what.erase(0, p + 2);
    if (what.size() > 2 * kMaxQuotedBytes) what = what.substr(0, 2 * kMaxQuotedBytes) + "...";
    return Fail("header is not valid JSON (byte " + std::to_string(position) + "): " + what);
  }

 private:
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  // Stores `v` in the innermost open container (or as the root) and returns
  // where it landed. Pointers in open_ stay valid: only the innermost
  // container grows, and ancestors are not touched until it closes.
  json* Place(json v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[keys_[open_.size() - 1]];
    slot = std::move(v);
    return &slot;
  }
  bool Add(json v) {
    Place(std::move(v));
    return true;
  }
  bool Open(json container) {
    if (open_.size() >= kMaxJsonDepth) {
      return Fail("header JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    // Name the container for duplicate-key messages before it is placed.
    if (open_.empty()) {
      where_.push_back("the top-level object (tensor names must be unique)");
    } else if (open_.back()->is_array()) {
      where_.push_back("an object inside an array");
    } else {
      where_.push_back(Quote(keys_[open_.size() - 1]));
    }
    open_.push_back(Place(std::move(container)));
    return true;
  }
  bool Close() {
    open_.pop_back();
    where_.pop_back();
    return true;
  }

  json root_;
  std::vector<json*> open_;        // containers being filled, outermost first
  std::vector<std::string> keys_;  // keys_[d]: current key of open_[d] (objects)
  std::vector<std::string> where_; // where_[d]: open_[d] as named in messages
  std::string error_;
};

// True for a JSON integer in [0, 2^64). nlohmann stores "-0" as a signed 0,
// which is still a fine non-negative integer.
bool AsU64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

// safetensors dtypes that pack several elements per byte; deltasync addresses
// tensors by whole bytes, so these are refused as unsupported, not corrupt.
bool IsSubByteDType(std::string_view name) {
  return name == "F4" || name == "F6_E2M3" || name == "F6_E3M2";
}

struct Entry {
  TensorView view;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Checks one tensor entry against the schema and the data section size.
// `prefix` is "<label>: tensor '<name>'".
Result<Entry> ParseEntry(const std::string& name, const json& v, const std::string& prefix,
                         uint64_t data_size) {
  if (!v.is_object()) {
    return Status::Corruption(prefix + ": entry is " + TypeText(v) + ", not an object");
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(field)) return Status::Corruption(prefix + ": missing field '" + field + "'");
  }
  for (const auto& [field, unused] : v.items()) {
    if (field != "dtype" && field != "shape" && field != "data_offsets") {
      return Status::Corruption(prefix + ": unexpected field " + Quote(field) +
                                " (allowed: dtype, shape, data_offsets)");
    }
  }

  Entry e;
  e.view.name = name;

  const json& dtype = v["dtype"];
  if (!dtype.is_string()) {
    return Status::Corruption(prefix + ": dtype is " + TypeText(dtype) + ", not a string");
  }
  const std::string& dtype_name = dtype.get_ref<const std::string&>();
  if (IsSubByteDType(dtype_name)) {
    return Status::Unsupported(prefix + ": dtype " + Quote(dtype_name) +
                               " packs elements below one byte, which deltasync does not support");
  }
  std::optional<DType> parsed = ParseDType(dtype_name);
  if (!parsed) return Status::Corruption(prefix + ": unknown dtype " + Quote(dtype_name));
  e.view.dtype = *parsed;

  const json& shape = v["shape"];
  if (!shape.is_array()) {
    return Status::Corruption(prefix + ": shape is " + TypeText(shape) + ", not an array");
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    uint64_t dim;
    if (!AsU64(shape[i], &dim)) {
      return Status::Corruption(prefix + ": shape[" + std::to_string(i) + "] is " +
                                Show(shape[i]) + ", not a non-negative integer below 2^64");
    }
    e.view.shape.push_back(dim);
  }

  const json& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    return Status::Corruption(prefix + ": data_offsets is " + Show(offsets) +
                              ", not an array of exactly 2 integers");
  }
  for (size_t i = 0; i < 2; ++i) {
    uint64_t* out = i == 0 ? &e.begin : &e.end;
    if (!AsU64(offsets[i], out)) {
      return Status::Corruption(prefix + ": data_offsets[" + std::to_string(i) + "] is " +
                                Show(offsets[i]) + ", not a non-negative integer below 2^64");
    }
  }
  std::string span_text = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.begin > e.end) {
    return Status::Corruption(prefix + ": data_offsets " + span_text + " end before they begin");
  }

  // Shape and offsets are both attacker-chosen, so the product is checked
  // before it is compared with anything.
  std::string shape_text = ShapeToString(e.view.shape);
  std::optional<uint64_t> count = CheckedElementCount(e.view.shape);
  if (!count) {
    return Status::Corruption(prefix + ": shape " + shape_text + " element count overflows 64 bits");
  }
  uint64_t need;
  if (__builtin_mul_overflow(*count, DTypeSize(e.view.dtype), &need)) {
    return Status::Corruption(prefix + ": shape " + shape_text + " x " + dtype_name +
                              " byte size overflows 64 bits");
  }
  if (e.end - e.begin != need) {
    return Status::Corruption(prefix + ": data_offsets " + span_text + " span " +
                              std::to_string(e.end - e.begin) + " bytes but shape " + shape_text +
                              " x " + dtype_name + " needs " + std::to_string(need));
  }
  if (e.end > data_size) {
    return Status::Corruption(prefix + ": data_offsets " + span_text + " extend past the " +
                              std::to_string(data_size) + "-byte data section (truncated?)");
  }
  return e;
}

Status ParseMetadata(const json& v, const std::string& label, Metadata* out) {
  if (!v.is_object()) {
    return Status::Corruption(label + ": __metadata__ is " + TypeText(v) + ", not an object");
  }
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string()) {
      return Status::Corruption(label + ": __metadata__ key " + Quote(key) + " has " +
                                TypeText(value) + " value; metadata values must be strings");
    }
    (*out)[key] = value.get<std::string>();
  }
  return Status::OK();
}

// Parses the header text; the DOM is returned only when it is well-formed,
// duplicate-free JSON of bounded depth.
Result<json> ParseHeaderJson(ByteSpan header, const std::string& label) {
  if (std::optional<size_t> bad = FirstInvalidUtf8(header)) {
    return Status::Corruption(label + ": header is not valid UTF-8 (byte " + std::to_string(*bad) +
                              " of the header)");
  }
  const char* first = reinterpret_cast<const char*>(header.data());
  // nlohmann's lexer takes a NUL byte as the end of input, so "{}\0junk"
  // would pass. JSON has no place for a raw NUL (strings must escape it), so
  // any NUL makes the header invalid.
  if (const void* nul = std::memchr(first, 0, header.size())) {
    return Status::Corruption(label + ": header is not valid JSON (byte " +
                              std::to_string(static_cast<const char*>(nul) - first) +
                              "): raw NUL byte");
  }
  // nlohmann also skips a leading UTF-8 byte order mark; safetensors'
  // reference reader does not, and a file we accept must be one it accepts.
  if (header.size() >= 3 && header[0] == 0xEF && header[1] == 0xBB && header[2] == 0xBF) {
    return Status::Corruption(label + ": header is not valid JSON (byte 0): byte order mark");
  }
  HeaderBuilder builder;
  // strict=true: only whitespace may follow the value, which admits the
  // space padding the official writer adds.
  bool ok = json::sax_parse(first, first + header.size(), &builder, json::input_format_t::json,
                            /*strict=*/true, /*ignore_comments=*/false);
  if (!ok) {
    std::string why = builder.error().empty() ? "header is not valid JSON" : builder.error();
    return Status::Corruption(label + ": " + why);
  }
  return std::move(builder.root());
}

// What a file that is not safetensors looks like, from its first bytes, for
// "not a safetensors file (it looks like ...)"; empty when it is not clear.
// A real file starts with a small little-endian length (zero high bytes), so
// none of these match one.
std::string LooksLike(ByteSpan bytes) {
  if (bytes.size() >= 2 && bytes[0] == 0x80 && bytes[1] >= 2 && bytes[1] <= 5) return "a PyTorch pickle";
  if (bytes.size() >= 4 && bytes[0] == 'P' && bytes[1] == 'K' && bytes[2] == 3 && bytes[3] == 4) {
    return "a zip archive (PyTorch .bin?)";
  }
  const size_t n = std::min<size_t>(bytes.size(), 64);
  if (n == 0) return "";
  for (size_t i = 0; i < n; ++i) {
    uint8_t c = bytes[i];
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return "";  // binary
    if (c == 0x7f) return "";
  }
  // Text is UTF-8; a sequence cut by the 64-byte window does not count.
  if (std::optional<size_t> bad = FirstInvalidUtf8(bytes.subspan(0, n)); bad && *bad + 4 <= n) return "";
  size_t i = 0;
  if (n >= 3 && bytes[0] == 0xEF && bytes[1] == 0xBB && bytes[2] == 0xBF) i = 3;  // UTF-8 byte order mark
  while (i < n && (bytes[i] == ' ' || bytes[i] == '\t' || bytes[i] == '\n' || bytes[i] == '\r')) ++i;
  if (i < n && (bytes[i] == '{' || bytes[i] == '[')) return "JSON";
  return "text";
}

// The message for a file whose length prefix cannot be right: what it looks
// like when that is clear, else the numbers.
Status NotSafetensors(ByteSpan bytes, const std::string& label, const std::string& numbers) {
  std::string looks = LooksLike(bytes);
  if (!looks.empty()) return Status::Corruption(label + ": not a safetensors file (it looks like " + looks + ")");
  return Status::Corruption(label + ": not a safetensors file (" + numbers + ")");
}

}  // namespace

// The file's fields are private, so the parse lives in a member; the helpers
// above do the rule checking.
Result<SafetensorsFile> SafetensorsFile::Parse(Blob blob, std::string label) {
  // No deltasync API throws. nlohmann can still throw (bad_alloc on a huge
  // header, or a type error we failed to foresee), so stop it here.
  try {
    const ByteSpan bytes = blob.bytes();
    if (bytes.size() < 8) {
      return NotSafetensors(bytes, label, "file is " + std::to_string(bytes.size()) +
                                              " bytes, shorter than the 8-byte header length");
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian
    if (n > kMaxSafetensorsHeaderBytes) {
      return NotSafetensors(bytes, label, "header length " + std::to_string(n) + " exceeds the " +
                                              std::to_string(kMaxSafetensorsHeaderBytes) + "-byte limit");
    }
    // n <= 1e8, so 8 + n cannot overflow.
    if (8 + n > bytes.size()) {
      // A header that starts like one was cut short; anything else is some
      // other kind of file.
      std::string numbers = "header length " + std::to_string(n) + " needs " + std::to_string(8 + n) +
                            " bytes but the file has only " + std::to_string(bytes.size());
      if (bytes.size() > 8 && bytes[8] == '{') return Status::Corruption(label + ": " + numbers + " (truncated?)");
      return NotSafetensors(bytes, label, numbers);
    }
    const ByteSpan header = bytes.subspan(8, n);
    const ByteSpan data = bytes.subspan(8 + n);

    DS_ASSIGN_OR_RETURN(json root, ParseHeaderJson(header, label));
    if (!root.is_object()) {
      return Status::Corruption(label + ": header JSON is " + TypeText(root) + ", not an object");
    }

    SafetensorsFile file;
    std::vector<Entry> entries;
    for (const auto& [name, value] : root.items()) {
      if (name == "__metadata__") {
        DS_RETURN_IF_ERROR(ParseMetadata(value, label, &file.metadata_));
        continue;
      }
      // The writer refuses empty names, so the reader does too: a file we
      // accept must be one we could have written.
      if (name.empty()) return Status::Corruption(label + ": tensor with an empty name");
      DS_ASSIGN_OR_RETURN(Entry e, ParseEntry(name, value, label + ": tensor " + Quote(name),
                                              data.size()));
      entries.push_back(std::move(e));
    }

    // Zero-size tensors may share an offset with each other and with the
    // tensor that starts there; sorting by (begin, end) puts them first, so a
    // single cursor walk sees any gap or overlap.
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return std::tie(a.begin, a.end, a.view.name) < std::tie(b.begin, b.end, b.view.name);
    });
    uint64_t cursor = 0;
    const Entry* prev = nullptr;
    for (const Entry& e : entries) {
      std::string where = label + ": tensor " + Quote(e.view.name) + ": data_offsets [" +
                          std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
      if (e.begin > cursor) {
        return Status::Corruption(where + " leave a gap: bytes [" + std::to_string(cursor) + ", " +
                                  std::to_string(e.begin) + ") belong to no tensor");
      }
      if (e.begin < cursor) {
        return Status::Corruption(where + " overlap tensor " + Quote(prev->view.name) +
                                  ", which ends at " + std::to_string(cursor));
      }
      cursor = e.end;
      prev = &e;
    }
    if (cursor != data.size()) {
      return Status::Corruption(label + ": data section is " + std::to_string(data.size()) +
                                " bytes but tensors cover only " + std::to_string(cursor) +
                                " (trailing bytes)");
    }

    file.tensors_.reserve(entries.size());
    for (Entry& e : entries) {
      e.view.data = data.subspan(e.begin, e.end - e.begin);
      file.tensors_.push_back(std::move(e.view));
    }
    file.blob_ = std::move(blob);
    file.label_ = std::move(label);
    return file;
  } catch (const std::exception& e) {
    return Status::Internal(label + ": unexpected error while parsing the header: " + e.what());
  }
}

}  // namespace deltasync
