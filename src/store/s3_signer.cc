#include "store/s3_signer.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <ctime>
#include <map>

namespace deltasync::s3 {
namespace {

constexpr char kHex[] = "0123456789abcdef";

std::string Hex(const unsigned char* data, size_t n) {
  std::string out(n * 2, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[data[i] >> 4];
    out[2 * i + 1] = kHex[data[i] & 15];
  }
  return out;
}

using Digest = std::vector<unsigned char>;

Digest HmacSha256(const Digest& key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return Digest(out, out + len);
}

// SigV4 header canonicalisation: trim, and squeeze runs of spaces into one
// (also inside quotes: the get-header-value-trim vector expects that).
std::string CanonicalHeaderValue(std::string_view v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

std::string DigestHex(const EVP_MD* md_type, std::span<const ByteSpan> parts, uint64_t offset, uint64_t length) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, md_type, nullptr);
  for (ByteSpan part : parts) {
    if (length == 0) break;
    if (offset >= part.size()) {
      offset -= part.size();
      continue;
    }
    uint64_t n = std::min<uint64_t>(part.size() - offset, length);
    EVP_DigestUpdate(ctx, part.data() + offset, n);
    length -= n;
    offset = 0;
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  return Hex(md, len);
}

}  // namespace

std::string Sha256Hex(std::span<const ByteSpan> parts, uint64_t offset, uint64_t length) {
  return DigestHex(EVP_sha256(), parts, offset, length);
}

std::string Sha256Hex(std::string_view data) {
  ByteSpan span(reinterpret_cast<const uint8_t*>(data.data()), data.size());
  return Sha256Hex(std::span<const ByteSpan>(&span, 1), 0, data.size());
}

std::string Md5Hex(std::span<const ByteSpan> parts, uint64_t offset, uint64_t length) {
  return DigestHex(EVP_md5(), parts, offset, length);
}

std::string UriEncode(std::string_view in, bool keep_slash) {
  static const char kUpperHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(in.size());
  for (char ch : in) {
    unsigned char c = static_cast<unsigned char>(ch);
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kUpperHex[c >> 4];
      out += kUpperHex[c & 15];
    }
  }
  return out;
}

std::string AmzDate(int64_t unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[20];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

SigV4Result SignV4(const SigV4Request& request, const SigV4Credentials& credentials,
                   std::string_view region, std::string_view service, std::string_view amz_date) {
  SigV4Result r;
  r.headers = request.headers;
  if (!credentials.session_token.empty()) {
    r.headers.emplace_back("x-amz-security-token", credentials.session_token);
  }

  // Query: encode names and values, then sort by encoded name, then value.
  std::vector<std::pair<std::string, std::string>> query;
  for (const auto& [k, v] : request.query) query.emplace_back(UriEncode(k, false), UriEncode(v, false));
  std::sort(query.begin(), query.end());
  for (const auto& [k, v] : query) {
    if (!r.canonical_query.empty()) r.canonical_query += '&';
    r.canonical_query += k + "=" + v;
  }

  // Headers: lower-case names, sorted; repeated names joined with ','.
  std::map<std::string, std::string> headers;
  for (const auto& [k, v] : r.headers) {
    std::string name = AsciiLower(k);
    std::string value = CanonicalHeaderValue(v);
    auto [it, inserted] = headers.emplace(name, value);
    if (!inserted) it->second += "," + value;
  }
  std::string canonical_headers, signed_headers;
  for (const auto& [k, v] : headers) {
    canonical_headers += k + ":" + v + "\n";
    if (!signed_headers.empty()) signed_headers += ';';
    signed_headers += k;
  }

  r.encoded_path = UriEncode(request.path.empty() ? "/" : request.path, true);
  r.canonical_request = request.method + "\n" + r.encoded_path + "\n" + r.canonical_query + "\n" +
                        canonical_headers + "\n" + signed_headers + "\n" + request.payload_hash;

  std::string date(amz_date.substr(0, 8));
  std::string scope = date + "/" + std::string(region) + "/" + std::string(service) + "/aws4_request";
  r.string_to_sign = "AWS4-HMAC-SHA256\n" + std::string(amz_date) + "\n" + scope + "\n" +
                     Sha256Hex(r.canonical_request);

  std::string k_secret = "AWS4" + credentials.secret_key;
  Digest key(k_secret.begin(), k_secret.end());
  key = HmacSha256(key, date);
  key = HmacSha256(key, region);
  key = HmacSha256(key, service);
  key = HmacSha256(key, "aws4_request");
  Digest sig = HmacSha256(key, r.string_to_sign);

  r.signature = Hex(sig.data(), sig.size());
  r.authorization = "AWS4-HMAC-SHA256 Credential=" + credentials.access_key + "/" + scope +
                    ", SignedHeaders=" + signed_headers + ", Signature=" + r.signature;
  return r;
}

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

}  // namespace deltasync::s3
