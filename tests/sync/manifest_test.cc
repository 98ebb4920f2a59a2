// Manifest: keys, XXH3-128, the JSON form, and one test per Parse rule.
#include "deltasync/manifest.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "deltasync/store.h"
#include "testing/test_bytes.h"

namespace deltasync {
namespace {

using testing::Span;

using Json = nlohmann::json;


TEST(ManifestKeysTest, SixDigitStepNames) {
  EXPECT_EQ(AnchorKey(10), "anchors/step_000010.safetensors");
  EXPECT_EQ(DeltaKey(11), "deltas/step_000011.safetensors");
  EXPECT_EQ(DeltaKey(0), "deltas/step_000000.safetensors");
  EXPECT_EQ(AnchorKey(999999), "anchors/step_999999.safetensors");
  // Like TRL's {version:06d}: beyond six digits the name just grows.
  EXPECT_EQ(DeltaKey(1234567), "deltas/step_1234567.safetensors");
  EXPECT_EQ(AnchorKey(UINT64_MAX), "anchors/step_18446744073709551615.safetensors");
  EXPECT_TRUE(ValidateKey(AnchorKey(UINT64_MAX)).ok());
  EXPECT_TRUE(ValidateKey(DeltaKey(1)).ok());
}

TEST(ManifestKeysTest, NativeObjectsLiveUnderTheirOwnPrefix) {
  EXPECT_EQ(CompressedAnchorKey(10), "ds/anchors/step_000010.safetensors");
  EXPECT_EQ(CompactDeltaKey(11), "ds/deltas/step_000011.safetensors");
  EXPECT_EQ(CumulativeDeltaKey(10, 15, IndexEncoding::kCompact),
            "ds/cumulative/step_000015_from_000010.compact.safetensors");
  EXPECT_EQ(CumulativeDeltaKey(10, 15, IndexEncoding::kGapDelta),
            "ds/cumulative/step_000015_from_000010.gap_delta.safetensors");
  // Never inside TRL's folders, whatever the version.
  for (uint64_t v : {1ull, 999999ull, 1234567ull}) {
    for (const std::string& key : {CompressedAnchorKey(v), CompactDeltaKey(v),
                                   CumulativeDeltaKey(v, v + 1, IndexEncoding::kRaw)}) {
      EXPECT_TRUE(key.starts_with("ds/")) << key;
      EXPECT_TRUE(ValidateKey(key).ok()) << key;
    }
  }
}

// Expected values from the reference implementation (python-xxhash 4.1.0,
// xxh3_128_hexdigest), which prints the canonical big-endian form.
TEST(Xxh3HexTest, KnownAnswers) {
  EXPECT_EQ(Xxh3Hex(ByteSpan()), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(Xxh3Hex(Span("deltasync")), "d69edd92b3a2aede11601c10a5e0d34e");
  std::vector<uint8_t> pattern(1000);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i % 251);
  EXPECT_EQ(Xxh3Hex(pattern), "18bf41bc8229e27733ef703fb2b20ed1");
}

TEST(Xxh3HexTest, PartsHashAsTheirConcatenation) {
  std::vector<ByteSpan> parts = {Span("hel"), ByteSpan(), Span("lo wor"), Span("ld")};
  EXPECT_EQ(Xxh3Hex(parts), "df8d09e93f874900a99b8775cc15b6c7");  // "hello world"
  EXPECT_EQ(Xxh3Hex(std::span<const ByteSpan>()), Xxh3Hex(ByteSpan()));
  // Large input split at awkward places (inside XXH3's 256-byte stripes).
  std::vector<uint8_t> big(1 << 20);
  std::mt19937 rng(7);
  for (uint8_t& b : big) b = static_cast<uint8_t>(rng());
  ByteSpan all(big);
  std::vector<ByteSpan> split = {all.subspan(0, 1), all.subspan(1, 255), all.subspan(256, 100000),
                                 all.subspan(100256)};
  EXPECT_EQ(Xxh3Hex(split), Xxh3Hex(all));
  EXPECT_NE(Xxh3Hex(all.subspan(1)), Xxh3Hex(all));
}

ObjectEntry Anchor(uint64_t v, uint64_t size = 1000) {
  return {PatchKind::kAnchor, AnchorKey(v), IndexEncoding::kRaw, size, std::string(32, 'a'), std::nullopt};
}
ObjectEntry Delta(uint64_t v, uint64_t base, IndexEncoding enc = IndexEncoding::kGapDelta) {
  return {PatchKind::kDelta, DeltaKey(v), enc, 100 + v, "0123456789abcdef0123456789abcdef", base};
}
VersionEntry Version(uint64_t v, std::vector<ObjectEntry> objects) {
  VersionEntry e;
  e.version = v;
  e.state_hash = StateHash{0x1111111111111111ull * v, 0xfedcba9876543210ull ^ v};
  e.total_elements = 1000000;
  e.changed_elements = 1000 + v;
  e.created_unix_ms = 1700000000000ull + v;
  e.objects = std::move(objects);
  return e;
}

Manifest Sample() {
  Manifest m;
  m.anchor_interval = 3;
  m.versions.push_back(Version(1, {Anchor(1)}));
  m.versions.push_back(Version(2, {Delta(2, 1)}));
  m.versions.push_back(Version(3, {Anchor(3), Delta(3, 2, IndexEncoding::kRaw)}));
  return m;
}

void ExpectSame(const Manifest& a, const Manifest& b) {
  EXPECT_EQ(a.anchor_interval, b.anchor_interval);
  ASSERT_EQ(a.versions.size(), b.versions.size());
  for (size_t i = 0; i < a.versions.size(); ++i) {
    const VersionEntry& x = a.versions[i];
    const VersionEntry& y = b.versions[i];
    EXPECT_EQ(x.version, y.version);
    EXPECT_EQ(x.state_hash, y.state_hash);
    EXPECT_EQ(x.total_elements, y.total_elements);
    EXPECT_EQ(x.changed_elements, y.changed_elements);
    EXPECT_EQ(x.created_unix_ms, y.created_unix_ms);
    ASSERT_EQ(x.objects.size(), y.objects.size());
    for (size_t j = 0; j < x.objects.size(); ++j) {
      EXPECT_EQ(x.objects[j].kind, y.objects[j].kind);
      EXPECT_EQ(x.objects[j].key, y.objects[j].key);
      EXPECT_EQ(x.objects[j].encoding, y.objects[j].encoding);
      EXPECT_EQ(x.objects[j].size, y.objects[j].size);
      EXPECT_EQ(x.objects[j].xxh3_128, y.objects[j].xxh3_128);
      EXPECT_EQ(x.objects[j].base_version, y.objects[j].base_version);
    }
  }
}

TEST(ManifestTest, FindLatestAndObjectAccessors) {
  Manifest m = Sample();
  ASSERT_NE(m.Latest(), nullptr);
  EXPECT_EQ(m.Latest()->version, 3u);
  EXPECT_EQ(m.Find(2)->version, 2u);
  EXPECT_EQ(m.Find(4), nullptr);
  EXPECT_EQ(m.Find(0), nullptr);
  EXPECT_NE(m.Find(1)->anchor(), nullptr);
  EXPECT_EQ(m.Find(1)->delta(), nullptr);
  EXPECT_EQ(m.Find(2)->anchor(), nullptr);
  EXPECT_EQ(m.Find(2)->delta()->key, DeltaKey(2));
  EXPECT_EQ(m.Find(3)->anchor()->key, AnchorKey(3));
  EXPECT_EQ(m.Find(3)->delta()->base_version, 2u);
  EXPECT_EQ(Manifest().Latest(), nullptr);
  EXPECT_EQ(Manifest().Find(1), nullptr);
}

// An anchor, the step delta and a cumulative delta from an older anchor in
// one version: delta() is the step delta (newest base).
TEST(ManifestTest, CumulativeDeltasBesideTheStepDelta) {
  Manifest m = Sample();
  ObjectEntry cumulative = Delta(4, 1, IndexEncoding::kCompact);
  cumulative.key = CumulativeDeltaKey(1, 4, IndexEncoding::kCompact);
  ObjectEntry step = Delta(4, 3, IndexEncoding::kCompact);
  step.key = CompactDeltaKey(4);
  ObjectEntry anchor = Anchor(4);
  anchor.key = CompressedAnchorKey(4);
  anchor.encoding = IndexEncoding::kCompact;
  m.versions.push_back(Version(4, {cumulative, step, anchor}));
  Result<Manifest> parsed = Manifest::Parse(Span(m.ToJson()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ExpectSame(m, *parsed);
  EXPECT_EQ(parsed->Find(4)->delta()->key, CompactDeltaKey(4));
  EXPECT_EQ(parsed->Find(4)->anchor()->encoding, IndexEncoding::kCompact);
}

TEST(ManifestTest, RoundTrip) {
  Manifest m = Sample();
  m.versions[1].total_elements = UINT64_MAX;  // extremes survive
  m.versions[1].changed_elements = UINT64_MAX;
  m.versions[2].version = UINT64_MAX;
  m.versions[2].objects[1].size = UINT64_MAX;
  std::string json = m.ToJson();
  Result<Manifest> parsed = Manifest::Parse(Span(json));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ExpectSame(m, *parsed);
  EXPECT_EQ(parsed->ToJson(), json);
}

TEST(ManifestTest, EmptyManifestRoundTrips) {
  Manifest m;
  std::string json = m.ToJson();
  Result<Manifest> parsed = Manifest::Parse(Span(json));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_TRUE(parsed->versions.empty());
  EXPECT_EQ(parsed->anchor_interval, 10u);
}

// The exact bytes: fixed field order, top level indented, one compact line
// per version, trailing newline (docs/format.md, "Manifest").
TEST(ManifestTest, DeterministicLayout) {
  Manifest m;
  m.anchor_interval = 10;
  m.versions.push_back(Version(1, {Anchor(1)}));
  m.versions.push_back(Version(2, {Delta(2, 1)}));
  const std::string expected =
      "{\n"
      "  \"format\": \"deltasync-manifest\",\n"
      "  \"format_version\": 1,\n"
      "  \"anchor_interval\": 10,\n"
      "  \"versions\": [\n"
      "    {\"version\":1,\"state_hash\":\"fedcba98765432111111111111111111\",\"total_elements\":1000000,"
      "\"changed_elements\":1001,\"created_unix_ms\":1700000000001,\"objects\":[{\"kind\":\"anchor\","
      "\"key\":\"anchors/step_000001.safetensors\",\"encoding\":\"raw\",\"size\":1000,"
      "\"xxh3_128\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}]},\n"
      "    {\"version\":2,\"state_hash\":\"fedcba98765432122222222222222222\",\"total_elements\":1000000,"
      "\"changed_elements\":1002,\"created_unix_ms\":1700000000002,\"objects\":[{\"kind\":\"delta\","
      "\"key\":\"deltas/step_000002.safetensors\",\"encoding\":\"gap_delta\",\"size\":102,"
      "\"xxh3_128\":\"0123456789abcdef0123456789abcdef\",\"base_version\":1}]}\n"
      "  ]\n"
      "}\n";
  EXPECT_EQ(m.ToJson(), expected);
  EXPECT_EQ(m.ToJson(), m.ToJson());
  EXPECT_EQ(Manifest().ToJson(),
            "{\n  \"format\": \"deltasync-manifest\",\n  \"format_version\": 1,\n  \"anchor_interval\": 10,\n"
            "  \"versions\": []\n}\n");
}

// The example in the format document is a valid manifest in the exact layout
// ToJson writes (docs/format.md, "Manifest").
TEST(ManifestTest, DocumentedExampleParsesAndIsCanonical) {
  const std::string marker = "```json\n{\n  \"format\": \"deltasync-manifest\"";
  std::string example;
  std::ifstream in(std::string(DS_SOURCE_DIR) + "/docs/format.md");
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  size_t start = text.find(marker);
  if (start != std::string::npos) {
    start += 8;  // past "```json\n"
    example = text.substr(start, text.find("```", start) - start);
  }
  ASSERT_FALSE(example.empty()) << "no manifest example found in docs/";
  Result<Manifest> parsed = Manifest::Parse(Span(example));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->ToJson(), example);
}

// "settings": optional; written after anchor_interval, which carries the same
// cadence for older readers; an older manifest without it parses as before.
TEST(ManifestTest, SettingsRoundTripBesideTheTopLevelAnchorInterval) {
  Manifest m = Sample();
  m.settings = BucketSettings{IndexEncoding::kGapDelta, 4, 2, 0.25};
  std::string json = m.ToJson();
  EXPECT_NE(json.find("  \"anchor_interval\": 4,\n  \"settings\": {\"encoding\":\"gap_delta\",\"anchor_interval\":4,"
                      "\"cumulative_interval\":2,\"anchor_max_fraction\":0.25},\n"),
            std::string::npos)
      << json;
  Result<Manifest> parsed = Manifest::Parse(Span(json));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_TRUE(parsed->settings.has_value());
  EXPECT_EQ(*parsed->settings, *m.settings);
  EXPECT_EQ(parsed->anchor_interval, 4u);
  EXPECT_EQ(parsed->ToJson(), json);

  Result<Manifest> older = Manifest::Parse(Span(Sample().ToJson()));
  ASSERT_TRUE(older.ok());
  EXPECT_FALSE(older->settings.has_value());
  EXPECT_EQ(older->anchor_interval, 3u);

  // Fields a later format adds to "settings" are ignored; integers are
  // numbers too.
  Json doc = Json::parse(json);
  doc["settings"]["future_setting"] = "x";
  doc["settings"]["anchor_max_fraction"] = 1;
  std::string text = doc.dump();
  parsed = Manifest::Parse(Span(text));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->settings->anchor_max_fraction, 1.0);
}

TEST(ManifestTest, UnknownFieldsAreIgnored) {
  Json doc = Json::parse(Sample().ToJson());
  doc["written_by"] = "deltasync 9.9";
  doc["future"] = {{"nested", {1, 2, {{"deep", true}}}}};
  doc["versions"][0]["note"] = "hello";
  doc["versions"][1]["objects"][0]["compression"] = "zstd";
  Result<Manifest> parsed = Manifest::Parse(Span(doc.dump()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ExpectSame(Sample(), *parsed);
}

TEST(ManifestTest, AcceptsAnyWhitespaceAndFieldOrder) {
  Json doc = Json::parse(Sample().ToJson());
  // nlohmann::json sorts keys, which reorders every object.
  Result<Manifest> parsed = Manifest::Parse(Span(doc.dump(7)));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ExpectSame(Sample(), *parsed);
}

TEST(ManifestTest, FirstListedVersionNeedNotBeOne) {
  // After retention dropped versions 1-2, version 3 (an anchor) comes first.
  Manifest m;
  m.versions.push_back(Version(3, {Anchor(3)}));
  m.versions.push_back(Version(4, {Delta(4, 3)}));
  Result<Manifest> parsed = Manifest::Parse(Span(m.ToJson()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ExpectSame(m, *parsed);
}

TEST(ManifestTest, LabelStartsEveryMessage) {
  Result<Manifest> r = Manifest::Parse(Span("[]"), "file:///b/manifest.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("file:///b/manifest.json: ", 0), 0u) << r.status().message();
}

// One case per rule: `mutate` breaks a valid manifest (Sample()) in one way.
struct BadCase {
  std::string name;
  std::function<void(Json&)> mutate;
  ErrorCode code;
  std::string message;  // a distinctive substring
};

std::vector<BadCase> BadCases() {
  return {
      {"root not an object", [](Json& d) { d = Json::array(); }, ErrorCode::kCorruption,
       "manifest.json: the document must be a JSON object, not array"},
      {"format missing", [](Json& d) { d.erase("format"); }, ErrorCode::kCorruption,
       "missing field 'format'"},
      {"format wrong", [](Json& d) { d["format"] = "sparse_weight_patch"; }, ErrorCode::kCorruption,
       "not a deltasync manifest"},
      {"format not a string", [](Json& d) { d["format"] = 1; }, ErrorCode::kCorruption,
       "'format' must be a string, got 1"},
      {"format_version newer", [](Json& d) { d["format_version"] = 3; }, ErrorCode::kUnsupported,
       "format_version 3 is newer than this deltasync reads (2); upgrade deltasync"},
      {"format_version zero", [](Json& d) { d["format_version"] = 0; }, ErrorCode::kCorruption,
       "'format_version' must be positive"},
      {"format_version string", [](Json& d) { d["format_version"] = "1"; }, ErrorCode::kCorruption,
       "'format_version' must be an integer"},
      {"anchor_interval zero", [](Json& d) { d["anchor_interval"] = 0; }, ErrorCode::kCorruption,
       "'anchor_interval' must be positive"},
      {"anchor_interval negative", [](Json& d) { d["anchor_interval"] = -10; }, ErrorCode::kCorruption,
       "'anchor_interval' must be an integer from 0 to 2^64-1, got -10"},
      {"versions missing", [](Json& d) { d.erase("versions"); }, ErrorCode::kCorruption,
       "missing field 'versions'"},
      {"versions not an array", [](Json& d) { d["versions"] = Json::object(); }, ErrorCode::kCorruption,
       "'versions' must be an array"},
      {"version entry not an object", [](Json& d) { d["versions"][1] = 2; }, ErrorCode::kCorruption,
       "versions[1]: must be a JSON object, got 2"},
      {"version missing", [](Json& d) { d["versions"][1].erase("version"); }, ErrorCode::kCorruption,
       "versions[1]: missing field 'version'"},
      {"version zero", [](Json& d) { d["versions"][0]["version"] = 0; }, ErrorCode::kCorruption,
       "versions[0] (version 0): version must be positive"},
      {"version fractional", [](Json& d) { d["versions"][0]["version"] = 1.5; }, ErrorCode::kCorruption,
       "versions[0]: 'version' must be an integer from 0 to 2^64-1, got 1.5"},
      {"version beyond uint64", [](Json& d) { d["versions"][0]["version"] = 1e20; }, ErrorCode::kCorruption,
       "'version' must be an integer"},
      {"versions repeated", [](Json& d) { d["versions"][1]["version"] = 1; }, ErrorCode::kCorruption,
       "versions[1] (version 1): not above the previous version 1; versions must be strictly ascending"},
      {"versions descending", [](Json& d) { d["versions"][1]["version"] = 5; }, ErrorCode::kCorruption,
       "versions[2] (version 3): not above the previous version 5"},
      {"state_hash upper-case", [](Json& d) { d["versions"][1]["state_hash"] = std::string(32, 'A'); },
       ErrorCode::kCorruption, "versions[1] (version 2): 'state_hash' must be 32 lower-case hex digits"},
      {"state_hash short", [](Json& d) { d["versions"][1]["state_hash"] = "abc"; }, ErrorCode::kCorruption,
       "'state_hash' must be 32 lower-case hex digits, got \"abc\""},
      {"state_hash missing", [](Json& d) { d["versions"][1].erase("state_hash"); }, ErrorCode::kCorruption,
       "missing field 'state_hash'"},
      {"total_elements negative", [](Json& d) { d["versions"][1]["total_elements"] = -1; },
       ErrorCode::kCorruption, "'total_elements' must be an integer"},
      {"changed above total", [](Json& d) { d["versions"][1]["changed_elements"] = 1000001; },
       ErrorCode::kCorruption, "changed_elements 1000001 exceeds total_elements 1000000"},
      {"created_unix_ms missing", [](Json& d) { d["versions"][1].erase("created_unix_ms"); },
       ErrorCode::kCorruption, "missing field 'created_unix_ms'"},
      {"objects not an array", [](Json& d) { d["versions"][1]["objects"] = "x"; }, ErrorCode::kCorruption,
       "'objects' must be an array"},
      {"objects empty", [](Json& d) { d["versions"][1]["objects"] = Json::array(); }, ErrorCode::kCorruption,
       "versions[1] (version 2): has 0 objects"},
      {"five objects",
       [](Json& d) {
         Json& objs = d["versions"][2]["objects"];
         for (int i = 0; i < 3; ++i) {
           Json extra = objs[0];
           extra["key"] = "extra" + std::to_string(i);
           objs.push_back(extra);
         }
       },
       ErrorCode::kCorruption, "has 5 objects"},
      {"object not an object", [](Json& d) { d["versions"][1]["objects"][0] = "deltas/x"; },
       ErrorCode::kCorruption, "versions[1] (version 2): objects[0]: must be a JSON object"},
      {"kind unknown", [](Json& d) { d["versions"][1]["objects"][0]["kind"] = "patch"; },
       ErrorCode::kCorruption, "objects[0]: unknown kind \"patch\""},
      {"key escapes", [](Json& d) { d["versions"][1]["objects"][0]["key"] = "../../etc/passwd"; },
       ErrorCode::kCorruption, "objects[0]: invalid key '../../etc/passwd': '..' segment"},
      {"key absolute", [](Json& d) { d["versions"][1]["objects"][0]["key"] = "/etc/passwd"; },
       ErrorCode::kCorruption, "starts with '/'"},
      {"key not a string", [](Json& d) { d["versions"][1]["objects"][0]["key"] = 5; }, ErrorCode::kCorruption,
       "'key' must be a string"},
      {"encoding unknown", [](Json& d) { d["versions"][1]["objects"][0]["encoding"] = "zstd"; },
       ErrorCode::kCorruption, "unknown index encoding 'zstd'"},
      {"encoding nvcomp", [](Json& d) { d["versions"][1]["objects"][0]["encoding"] = "nvcomp_cascaded"; },
       ErrorCode::kUnsupported, "versions[1] (version 2): objects[0]: encoding nvcomp_cascaded"},
      {"size negative", [](Json& d) { d["versions"][1]["objects"][0]["size"] = -5; }, ErrorCode::kCorruption,
       "'size' must be an integer"},
      {"size missing", [](Json& d) { d["versions"][1]["objects"][0].erase("size"); }, ErrorCode::kCorruption,
       "objects[0]: missing field 'size'"},
      {"xxh3 wrong length",
       [](Json& d) { d["versions"][1]["objects"][0]["xxh3_128"] = std::string(31, '0'); },
       ErrorCode::kCorruption, "'xxh3_128' must be 32 lower-case hex digits"},
      {"xxh3 not hex", [](Json& d) { d["versions"][1]["objects"][0]["xxh3_128"] = std::string(32, 'g'); },
       ErrorCode::kCorruption, "'xxh3_128' must be 32 lower-case hex digits"},
      {"anchor with base", [](Json& d) { d["versions"][0]["objects"][0]["base_version"] = 0; },
       ErrorCode::kCorruption, "versions[0] (version 1): objects[0]: an anchor has no base_version"},
      {"delta without base", [](Json& d) { d["versions"][1]["objects"][0].erase("base_version"); },
       ErrorCode::kCorruption, "versions[1] (version 2): objects[0]: delta has no base_version"},
      {"delta base not a number", [](Json& d) { d["versions"][1]["objects"][0]["base_version"] = nullptr; },
       ErrorCode::kCorruption, "'base_version' must be an integer from 0 to 2^64-1, got null"},
      {"delta base not below", [](Json& d) { d["versions"][1]["objects"][0]["base_version"] = 2; },
       ErrorCode::kCorruption,
       "manifest.json: versions[1] (version 2): delta base_version 2 is not below the version"},
      {"delta base above",
       [](Json& d) {
         d["versions"][2]["version"] = 12;
         d["versions"][2]["objects"][1]["base_version"] = 14;
       },
       ErrorCode::kCorruption,
       "manifest.json: versions[2] (version 12): delta base_version 14 is not below the version"},
      {"delta base not listed",
       [](Json& d) {
         d["versions"][2]["version"] = 5;
         d["versions"][2]["objects"][1]["base_version"] = 4;
       },
       ErrorCode::kCorruption, "versions[2] (version 5): delta base_version 4 is not a listed version"},
      {"two anchors",
       [](Json& d) {
         Json& objs = d["versions"][2]["objects"];
         objs[1] = objs[0];
         objs[1]["key"] = "anchors/other";
       },
       ErrorCode::kCorruption, "versions[2] (version 3): objects[1]: a second anchor"},
      {"two deltas",
       [](Json& d) {
         Json& objs = d["versions"][2]["objects"];
         objs[0] = objs[1];
         objs[0]["key"] = "deltas/other";
       },
       ErrorCode::kCorruption, "objects[1]: a second delta from base_version 2"},
      {"key listed twice",
       [](Json& d) { d["versions"][2]["objects"][0]["key"] = "anchors/step_000001.safetensors"; },
       ErrorCode::kCorruption, "key 'anchors/step_000001.safetensors' is already listed by version 1"},
      {"first version without anchor", [](Json& d) { d["versions"].erase(0); }, ErrorCode::kCorruption,
       "versions[0] (version 2): the first listed version has no anchor"},
      {"settings not an object", [](Json& d) { d["settings"] = 3; }, ErrorCode::kCorruption,
       "manifest.json: settings: must be a JSON object, got 3"},
      {"settings without encoding",
       [](Json& d) {
         d["settings"] = {{"anchor_interval", 3}, {"cumulative_interval", 0}, {"anchor_max_fraction", 0}};
       },
       ErrorCode::kCorruption, "settings: missing field 'encoding'"},
      {"settings with an unknown encoding",
       [](Json& d) {
         d["settings"] = {{"encoding", "zstd"}, {"anchor_interval", 3}, {"cumulative_interval", 0},
                          {"anchor_max_fraction", 0}};
       },
       ErrorCode::kCorruption, "settings: 'encoding' is \"zstd\"; a bucket is published as compact, gap_delta or raw"},
      {"settings with anchor_interval 0",
       [](Json& d) {
         d["settings"] = {{"encoding", "raw"}, {"anchor_interval", 0}, {"cumulative_interval", 0},
                          {"anchor_max_fraction", 0}};
       },
       ErrorCode::kCorruption, "settings: 'anchor_interval' must be positive"},
      {"settings with a negative fraction",
       [](Json& d) {
         d["settings"] = {{"encoding", "raw"}, {"anchor_interval", 3}, {"cumulative_interval", 0},
                          {"anchor_max_fraction", -0.5}};
       },
       ErrorCode::kCorruption, "settings: 'anchor_max_fraction' must be a number >= 0, got -0.5"},
      {"settings with a string fraction",
       [](Json& d) {
         d["settings"] = {{"encoding", "raw"}, {"anchor_interval", 3}, {"cumulative_interval", 0},
                          {"anchor_max_fraction", "0.5"}};
       },
       ErrorCode::kCorruption, "'anchor_max_fraction' must be a number >= 0, got \"0.5\""},
      {"first version's delta base dropped",
       // Retention removed version 2 but kept version 3's delta, based on it.
       [](Json& d) {
         d["versions"].erase(0);
         d["versions"].erase(0);
       },
       ErrorCode::kCorruption, "versions[0] (version 3): delta base_version 2 is not a listed version"},
  };
}

TEST(ManifestParseTest, EachRuleRefusesWithItsMessage) {
  const std::string valid = Sample().ToJson();
  ASSERT_TRUE(Manifest::Parse(Span(valid)).ok());
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.name);
    Json doc = Json::parse(valid);
    c.mutate(doc);
    std::string text = doc.dump(2);
    Result<Manifest> r = Manifest::Parse(Span(text));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().rfind("manifest.json: ", 0), 0u) << r.status().message();
  }
}

TEST(ManifestParseTest, RefusesBytesThatAreNotOneJsonDocument) {
  for (const std::string& text :
       std::vector<std::string>{"", "{", "{} trailing", "not json", "{\"format\": \"deltasync-manifest\",}",
                                std::string("{\"a\":\"\xff\"}")}) {
    SCOPED_TRACE(text);
    Result<Manifest> r = Manifest::Parse(Span(text));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kCorruption);
    EXPECT_NE(r.status().message().find("manifest.json: not valid JSON"), std::string::npos)
        << r.status().message();
  }
}

TEST(ManifestParseTest, RefusesDuplicateFields) {
  std::string valid = Sample().ToJson();
  // A second "state_hash" in version 1: which one would a reader trust?
  std::string text = valid;
  size_t at = text.find("\"state_hash\"");
  text.insert(at, "\"state_hash\":\"00000000000000000000000000000000\",");
  Result<Manifest> r = Manifest::Parse(Span(text));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(r.status().message().find("field 'state_hash' appears twice"), std::string::npos)
      << r.status().message();
  // The same name in different objects is fine.
  EXPECT_TRUE(Manifest::Parse(Span(valid)).ok());
}

TEST(ManifestParseTest, RefusesOversizedInput) {
  std::string big(size_t{64} << 20, ' ');
  big += "{}";
  Result<Manifest> r = Manifest::Parse(Span(big));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(r.status().message().find("64 MiB"), std::string::npos) << r.status().message();
}

TEST(ManifestParseTest, DeepNestingIsRefusedWithoutCrashing) {
  for (size_t levels : {33, 100000, 10000000}) {
    SCOPED_TRACE(levels);
    std::string deep = "{\"format\":" + std::string(levels, '[') + std::string(levels, ']') + "}";
    Result<Manifest> r = Manifest::Parse(Span(deep));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kCorruption);
    EXPECT_NE(r.status().message().find("nested deeper than 32 levels"), std::string::npos)
        << r.status().message();
  }
  // Brackets inside strings (escaped quotes too) are text, not nesting; a
  // deep-ish extension field within the limit is fine.
  Json doc = Json::parse(Sample().ToJson());
  doc["note"] = "\"" + std::string(100, '[');
  Json nested = 1;
  for (int i = 0; i < 25; ++i) nested = Json::array({nested});
  doc["extension"] = nested;
  Result<Manifest> ok = Manifest::Parse(Span(doc.dump()));
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  // A wrong-typed container is named, not printed.
  doc["format"] = nested;
  Result<Manifest> bad = Manifest::Parse(Span(doc.dump()));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'format' must be a string, got an array"), std::string::npos)
      << bad.status().message();
}

// Random damage never crashes or throws; it is refused or still a valid manifest.
TEST(ManifestParseTest, RandomCorruptionNeverEscapes) {
  const std::string valid = Sample().ToJson();
  std::mt19937 rng(42);
  for (int i = 0; i < 3000; ++i) {
    std::string text = valid;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % text.size();
      switch (rng() % 3) {
        case 0:
          text[pos] = static_cast<char>(rng());
          break;
        case 1:
          text.erase(pos, 1 + rng() % 8);
          break;
        default:
          text.insert(pos, 1, "{}[]\",:0-9eE."[rng() % 13]);
          break;
      }
    }
    Result<Manifest> r = Manifest::Parse(Span(text));
    if (r.ok()) {
      // Whatever got through re-serialises and parses again.
      EXPECT_TRUE(Manifest::Parse(Span(r->ToJson())).ok()) << text;
    }
  }
}

}  // namespace
}  // namespace deltasync

namespace deltasync {
namespace {

TEST(ManifestWriterTest, StampRoundTripsAndIsValidated) {
  Manifest m;
  m.writer = WriterStamp{"trainer-0-1234-deadbeefcafef00d", 7};
  std::string json = m.ToJson();
  EXPECT_NE(json.find("\"writer\": {\"id\": \"trainer-0-1234-deadbeefcafef00d\", \"seq\": 7}"), std::string::npos)
      << json;
  auto parsed = Manifest::Parse(ByteSpan(reinterpret_cast<const uint8_t*>(json.data()), json.size()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_TRUE(parsed->writer.has_value());
  EXPECT_EQ(*parsed->writer, *m.writer);
  EXPECT_EQ(parsed->ToJson(), json);

  for (std::string bad : {"\"writer\": 3", "\"writer\": {\"id\": \"has space\", \"seq\": 1}",
                          "\"writer\": {\"id\": \"\", \"seq\": 1}", "\"writer\": {\"id\": \"a\", \"seq\": -1}"}) {
    std::string doc = "{\"format\": \"deltasync-manifest\", \"format_version\": 1, \"anchor_interval\": 10, " + bad +
                      ", \"versions\": []}";
    auto r = Manifest::Parse(ByteSpan(reinterpret_cast<const uint8_t*>(doc.data()), doc.size()));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::kCorruption);
    EXPECT_NE(r.status().message().find("writer"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace deltasync
