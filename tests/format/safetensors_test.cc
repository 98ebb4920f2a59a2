// Tests for the safetensors reader and writer: round trips, determinism, and
// one test per reader rule, each checking the code and a phrase only that
// rule's message contains (so a different rule firing fails the test).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "deltasync/safetensors.h"

namespace deltasync {
namespace {

namespace fs = std::filesystem;

constexpr char kLabel[] = "t.safetensors";

// A file with `header` as its JSON (unpadded) and `data_len` data bytes.
std::vector<uint8_t> Raw(std::string_view header, size_t data_len = 0) {
  std::vector<uint8_t> out(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_len; ++i) out.push_back(static_cast<uint8_t>(i * 7 + 1));
  return out;
}

Result<SafetensorsFile> ParseBytes(std::vector<uint8_t> bytes) {
  return SafetensorsFile::Parse(Blob::FromVector(std::move(bytes)), kLabel);
}

// The status of parsing `bytes`; OK on success.
Status ParseStatus(std::vector<uint8_t> bytes) { return ParseBytes(std::move(bytes)).status(); }

#define EXPECT_ERROR(status_expr, error_code, phrase)                         \
  do {                                                                        \
    ::deltasync::Status s_ = (status_expr);                                   \
    EXPECT_EQ(s_.code(), error_code) << s_.ToString();                        \
    EXPECT_NE(s_.message().find(phrase), std::string::npos)                   \
        << "expected \"" << (phrase) << "\" in: " << s_.ToString();           \
  } while (0)

// Every reader error names the file.
#define EXPECT_CORRUPT(bytes, phrase)                                         \
  do {                                                                        \
    ::deltasync::Status st_ = ParseStatus(bytes);                             \
    EXPECT_ERROR(st_, ErrorCode::kCorruption, phrase);                        \
    EXPECT_EQ(st_.message().rfind(kLabel, 0), 0u) << st_.message();           \
  } while (0)

// A one-tensor header: 'w' with the given fields.
std::string One(std::string_view fields) { return "{\"w\":{" + std::string(fields) + "}}"; }

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 31);
  return v;
}

void ExpectSameTensor(const TensorView& a, const TensorView& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.dtype, b.dtype) << a.name;
  EXPECT_EQ(a.shape, b.shape) << a.name;
  EXPECT_TRUE(std::equal(a.data.begin(), a.data.end(), b.data.begin(), b.data.end())) << a.name;
}

// --- Round trips -----------------------------------------------------------

TEST(SafetensorsRoundTrip, EveryDType) {
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<TensorView> views;
  for (int i = 0; i <= static_cast<int>(DType::kF64); ++i) {
    DType d = static_cast<DType>(i);
    buffers.push_back(Pattern(6 * DTypeSize(d), static_cast<uint8_t>(i)));
    views.push_back({"t_" + std::string(DTypeName(d)), d, {2, 3}, buffers.back()});
  }
  Metadata meta = {{"format", "pt"}, {"step", "12"}};
  auto bytes = SerializeSafetensors(meta, views);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto file = ParseBytes(*bytes);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->metadata(), meta);
  EXPECT_EQ(file->label(), kLabel);
  ASSERT_EQ(file->tensors().size(), views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    ExpectSameTensor(file->tensors()[i], views[i]);  // file order == written order
    const TensorView* found = file->Find(views[i].name);
    ASSERT_NE(found, nullptr);
    EXPECT_EQ(found, &file->tensors()[i]);
  }
  EXPECT_EQ(file->Find("missing"), nullptr);
}

TEST(SafetensorsRoundTrip, ZeroSizeAndScalarTensors) {
  std::vector<uint8_t> scalar = Pattern(4, 1), vec = Pattern(6, 2);
  std::vector<TensorView> views = {
      {"scalar", DType::kF32, {}, scalar},
      {"empty_b", DType::kBF16, {0}, {}},
      {"empty_a", DType::kF64, {4, 0, 2}, {}},
      {"vec", DType::kU16, {3}, vec},
      {"empty_end", DType::kU8, {0}, {}},
  };
  auto bytes = SerializeSafetensors({}, views);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto file = ParseBytes(*bytes);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  // Offset order; the zero-size tensors at offset 4 come before 'vec' (which
  // starts there too) and are ordered among themselves by name.
  std::vector<std::string> names;
  for (const TensorView& t : file->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"scalar", "empty_a", "empty_b", "vec", "empty_end"}));
  ExpectSameTensor(*file->Find("scalar"), views[0]);
  EXPECT_EQ(file->Find("scalar")->num_elements(), 1u);
  EXPECT_TRUE(file->Find("scalar")->shape.empty());
  ExpectSameTensor(*file->Find("empty_a"), views[2]);
  ExpectSameTensor(*file->Find("vec"), views[3]);
}

TEST(SafetensorsRoundTrip, EmptyFileHasNoTensors) {
  auto bytes = SerializeSafetensors({}, {});
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, Raw("{}      "));
  auto file = ParseBytes(*bytes);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE(file->tensors().empty());
  EXPECT_TRUE(file->metadata().empty());
}

TEST(SafetensorsRoundTrip, ViewsPointIntoTheBlob) {
  std::vector<uint8_t> d = Pattern(8, 3);
  std::vector<TensorView> views = {{"a", DType::kBF16, {2}, ByteSpan(d).first(4)},
                                   {"b", DType::kI16, {2}, ByteSpan(d).subspan(4)}};
  auto file = ParseBytes(SerializeSafetensors({}, views).value());
  ASSERT_TRUE(file.ok());
  SafetensorsFile copy = *file;  // copies share the blob
  const uint8_t* begin = copy.blob().data();
  for (const TensorView& t : copy.tensors()) {
    EXPECT_GE(t.data.data(), begin);
    EXPECT_LE(t.data.data() + t.data.size(), begin + copy.blob().size());
  }
  EXPECT_EQ(copy.tensors()[1].data.data(), copy.tensors()[0].data.data() + 4);
}

// --- Writer ----------------------------------------------------------------

TEST(SafetensorsWriter, ExactBytes) {
  std::vector<uint8_t> d = {1, 2, 3, 4};
  std::vector<TensorView> views = {{"w", DType::kBF16, {2}, d}};
  auto header = EncodeSafetensorsHeader({{"k", "v"}}, views);
  ASSERT_TRUE(header.ok());
  // "__metadata__" first, compact, fields in safetensors' order, spaces up
  // to a multiple of 8.
  std::string json =
      R"({"__metadata__":{"k":"v"},"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})";
  json.append((8 - json.size() % 8) % 8, ' ');
  EXPECT_EQ(*header, Raw(json));
  EXPECT_EQ(header->size() % 8, 0u);
}

TEST(SafetensorsWriter, KeepsGivenOrderAndIsDeterministic) {
  std::vector<uint8_t> a = Pattern(4, 1), b = Pattern(2, 2);
  std::vector<TensorView> views = {{"z", DType::kF32, {1}, a}, {"a", DType::kU8, {2}, b}};
  auto first = SerializeSafetensors({{"b", "2"}, {"a", "1"}}, views);
  auto second = SerializeSafetensors({{"a", "1"}, {"b", "2"}}, views);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*first, *second);
  std::string text(first->begin() + 8, first->end());
  EXPECT_LT(text.find("\"z\""), text.find("\"a\":{"));  // given order, not sorted
  EXPECT_NE(text.find(R"("z":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})"), std::string::npos);
  EXPECT_NE(text.find(R"("a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]})"), std::string::npos);
  auto again = SerializeSafetensors(ParseBytes(*first)->metadata(), ParseBytes(*first)->tensors());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);
}

// The header from (name, dtype, shape, byte length) is the view-based
// header byte for byte, and refuses what it refuses with the same message.
TEST(SafetensorsWriter, HeaderFromLayoutsEqualsHeaderFromViews) {
  std::vector<uint8_t> a = Pattern(12, 1), b = Pattern(6, 2), c = Pattern(0, 3);
  std::vector<TensorView> views = {
      {"z.weight", DType::kF32, {3}, a}, {"a", DType::kBF16, {1, 3}, b}, {"empty", DType::kU8, {0}, c}};
  const Metadata m = {{"format", "pt"}, {"k", "v\"x"}};
  for (size_t n = 0; n <= views.size(); ++n) {
    std::vector<TensorLayout> layouts;
    for (size_t i = 0; i < n; ++i) layouts.push_back({views[i].name, views[i].dtype, views[i].shape, views[i].data.size()});
    auto from_views = EncodeSafetensorsHeader(m, std::span<const TensorView>(views.data(), n));
    auto from_layouts = EncodeSafetensorsHeader(m, std::span<const TensorLayout>(layouts));
    ASSERT_TRUE(from_views.ok()) << from_views.status().ToString();
    ASSERT_TRUE(from_layouts.ok()) << from_layouts.status().ToString();
    EXPECT_EQ(*from_layouts, *from_views) << n << " tensors";
  }
  // A length that disagrees with shape x dtype: the same error.
  std::vector<TensorLayout> bad = {{"a", DType::kBF16, views[1].shape, 5}};
  std::vector<TensorView> bad_view = {{"a", DType::kBF16, {1, 3}, ByteSpan(b.data(), 5)}};
  Status s1 = EncodeSafetensorsHeader(m, std::span<const TensorLayout>(bad)).status();
  Status s2 = EncodeSafetensorsHeader(m, std::span<const TensorView>(bad_view)).status();
  EXPECT_ERROR(s1, ErrorCode::kInvalidArgument, "data is 5 bytes but shape [1, 3] x BF16 needs 6");
  EXPECT_EQ(s1.ToString(), s2.ToString());
}

TEST(SafetensorsWriter, EscapesNames) {
  std::vector<uint8_t> d = {1};
  std::vector<TensorView> views = {{"quote\" back\\ nl\n \xc3\xa9", DType::kU8, {1}, d}};
  auto file = ParseBytes(SerializeSafetensors({{"\t", "\x01"}}, views).value());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->tensors()[0].name, views[0].name);
  EXPECT_EQ(file->metadata().at("\t"), "\x01");
}

TEST(SafetensorsWriter, RejectsBadInput) {
  std::vector<uint8_t> d = Pattern(4, 0);
  auto encode = [](std::vector<TensorView> v, Metadata m = {}) {
    return EncodeSafetensorsHeader(m, v).status();
  };
  EXPECT_ERROR(encode({{"a", DType::kU8, {4}, d}, {"a", DType::kU8, {4}, d}}),
               ErrorCode::kInvalidArgument, "duplicate tensor name 'a'");
  EXPECT_ERROR(encode({{"__metadata__", DType::kU8, {4}, d}}), ErrorCode::kInvalidArgument,
               "reserved for the metadata");
  EXPECT_ERROR(encode({{"", DType::kU8, {4}, d}}), ErrorCode::kInvalidArgument, "empty name");
  EXPECT_ERROR(encode({{"a", DType::kBF16, {3}, d}}), ErrorCode::kInvalidArgument,
               "tensor 'a': data is 4 bytes but shape [3] x BF16 needs 6");
  EXPECT_ERROR(encode({{"a", DType::kU8, {1ull << 32, 1ull << 32}, d}}),
               ErrorCode::kInvalidArgument, "overflows 64 bits");
  EXPECT_ERROR(encode({{"bad\xc0\xaf", DType::kU8, {4}, d}}), ErrorCode::kInvalidArgument,
               "is not valid UTF-8");
  EXPECT_ERROR(encode({}, {{"k", "\xed\xa0\x80"}}), ErrorCode::kInvalidArgument,
               "metadata value for key 'k' is not valid UTF-8");
  EXPECT_ERROR(encode({}, {{"\xff", "v"}}), ErrorCode::kInvalidArgument, "metadata key");
  EXPECT_FALSE(SerializeSafetensors({}, std::vector<TensorView>{{"", DType::kU8, {4}, d}}).ok());
}

class SafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("safetensors_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> Listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
  static std::vector<uint8_t> Slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  fs::path dir_;
};

TEST_F(SafetensorsFileTest, WriteThenOpen) {
  std::vector<uint8_t> a = Pattern(12, 5), b = Pattern(2, 6);
  std::vector<TensorView> views = {{"a", DType::kF32, {3}, a}, {"b", DType::kI8, {2}, b}};
  const std::string path = dir_ / "model.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(path, {{"m", "1"}}, views).ok());
  EXPECT_EQ(Listing(), std::vector<std::string>{"model.safetensors"});  // no temp files left
  EXPECT_EQ(Slurp(path), SerializeSafetensors({{"m", "1"}}, views).value());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->label(), path);
  ExpectSameTensor(file->tensors()[0], views[0]);
  ExpectSameTensor(file->tensors()[1], views[1]);

  // Replacing works, and the old mapping stays intact (rename, not rewrite).
  std::vector<TensorView> smaller = {views[1]};
  ASSERT_TRUE(WriteSafetensorsFile(path, {}, smaller).ok());
  EXPECT_EQ(Listing(), std::vector<std::string>{"model.safetensors"});
  ExpectSameTensor(file->tensors()[0], views[0]);
  EXPECT_EQ(SafetensorsFile::Open(path)->tensors().size(), 1u);
}

TEST_F(SafetensorsFileTest, FailedWriteLeavesTargetUntouched) {
  std::vector<uint8_t> a = Pattern(4, 1);
  std::vector<TensorView> good = {{"a", DType::kU8, {4}, a}};
  const std::string path = dir_ / "model.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(path, {}, good).ok());
  const std::vector<uint8_t> before = Slurp(path);

  std::vector<TensorView> bad = {{"a", DType::kU8, {4}, a}, {"a", DType::kU8, {4}, a}};
  EXPECT_ERROR(WriteSafetensorsFile(path, {}, bad), ErrorCode::kInvalidArgument,
               path + ": duplicate tensor name 'a'");
  EXPECT_EQ(Slurp(path), before);
  EXPECT_EQ(Listing(), std::vector<std::string>{"model.safetensors"});

  const std::string nowhere = dir_ / "no_such_dir" / "x.safetensors";
  EXPECT_EQ(WriteSafetensorsFile(nowhere, {}, good).code(), ErrorCode::kIOError);
  EXPECT_EQ(Listing(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsFileTest, OpenMissingIsNotFound) {
  EXPECT_ERROR(SafetensorsFile::Open(dir_ / "absent.safetensors").status(), ErrorCode::kNotFound,
               "absent.safetensors");
}

// --- Reader rules, in the order the reader checks them -----------------------

TEST(SafetensorsReader, AcceptsUnpaddedAndWhitespacePaddedHeaders) {
  const std::string json = One(R"("dtype":"U8","shape":[2],"data_offsets":[0,2])");
  EXPECT_TRUE(ParseBytes(Raw(json, 2)).ok());
  EXPECT_TRUE(ParseBytes(Raw(json + "     ", 2)).ok());
  EXPECT_TRUE(ParseBytes(Raw(" \n" + json + " \t\r\n", 2)).ok());
  // "-0" is an integer zero.
  EXPECT_TRUE(ParseBytes(Raw(One(R"("dtype":"U8","shape":[-0],"data_offsets":[0,-0])"))).ok());
}

TEST(SafetensorsReader, ShorterThanLengthPrefix) {
  for (size_t n = 0; n < 8; ++n) {
    EXPECT_CORRUPT(std::vector<uint8_t>(n, 0), "shorter than the 8-byte header length");
  }
}

TEST(SafetensorsReader, HeaderLengthAboveCap) {
  std::vector<uint8_t> bytes = Raw("{}");
  const uint64_t n = kMaxSafetensorsHeaderBytes + 1;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  EXPECT_CORRUPT(bytes, "header length 100000001 exceeds the 100000000-byte limit");
  for (int i = 0; i < 8; ++i) bytes[i] = 0xff;  // would overflow 8 + n
  EXPECT_CORRUPT(bytes, "exceeds the 100000000-byte limit");
}

TEST(SafetensorsReader, HeaderLongerThanFile) {
  std::vector<uint8_t> bytes = Raw("{}");
  bytes[0] = 3;
  EXPECT_CORRUPT(bytes, "header length 3 needs 11 bytes but the file has only 10");
}

TEST(SafetensorsReader, OtherFilesSayWhatTheyLookLike) {
  auto bytes = [](std::string_view text) { return std::vector<uint8_t>(text.begin(), text.end()); };
  EXPECT_CORRUPT(bytes("{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\"}}"),
                 "not a safetensors file (it looks like JSON)");
  EXPECT_CORRUPT(bytes("  [1, 2, 3]\n"), "not a safetensors file (it looks like JSON)");
  EXPECT_CORRUPT(bytes("{}\n"), "not a safetensors file (it looks like JSON)");  // shorter than 8 bytes
  EXPECT_CORRUPT(bytes("hello, these are my notes about the run\n"), "not a safetensors file (it looks like text)");
  std::vector<uint8_t> pickle = {0x80, 0x02, 0x7d, 0x71, 0x00, 0x28, 0x58, 0x01, 0x00, 0x00, 0x00, 0x61};
  EXPECT_CORRUPT(pickle, "not a safetensors file (it looks like a PyTorch pickle)");
  std::vector<uint8_t> zip = {'P', 'K', 3, 4, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_CORRUPT(zip, "not a safetensors file (it looks like a zip archive (PyTorch .bin?))");
  // Binary that is none of these still gets the numbers.
  std::vector<uint8_t> noise(64, 0xfe);
  EXPECT_CORRUPT(noise, "not a safetensors file (header length");
}

TEST(SafetensorsReader, CutShortFileSaysTruncated) {
  std::vector<uint8_t> whole = Raw(One(R"("dtype":"U8","shape":[4],"data_offsets":[0,4])"), 4);
  std::vector<uint8_t> in_header(whole.begin(), whole.begin() + 20);
  EXPECT_CORRUPT(in_header, "(truncated?)");
  std::vector<uint8_t> in_data(whole.begin(), whole.end() - 2);
  EXPECT_CORRUPT(in_data, "extend past the 2-byte data section (truncated?)");
}

TEST(SafetensorsReader, HeaderNotUtf8) {
  // Each is invalid inside an otherwise fine metadata string.
  for (std::string bad : {"\xc0\xaf", "\xc1\xbf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xed\xbf\xbf",
                          "\xf0\x80\x80\xaf", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\x80",
                          "\xbf", "\xe2\x82", "\xff", "\xc3\x28"}) {
    SCOPED_TRACE("bytes: " + testing::PrintToString(bad));
    EXPECT_CORRUPT(Raw(R"({"__metadata__":{"k":")" + bad + R"("}})"), "header is not valid UTF-8");
  }
  // Boundaries that are valid: U+0080, U+07FF, U+0800, U+D7FF, U+E000, U+10000, U+10FFFF.
  auto file = ParseBytes(Raw(
      "{\"__metadata__\":{\"k\":\"\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80"
      "\xf0\x90\x80\x80\xf4\x8f\xbf\xbf\"}}"));
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  // A truncated sequence at the very end of the header.
  EXPECT_CORRUPT(Raw("{}\xe2"), "header is not valid UTF-8 (byte 2 of the header)");
}

TEST(SafetensorsReader, HeaderNotJson) {
  EXPECT_CORRUPT(Raw("{"), "header is not valid JSON");
  EXPECT_CORRUPT(Raw(""), "header is not valid JSON");
  EXPECT_CORRUPT(Raw("{} x"), "header is not valid JSON");
  // nlohmann stops at a NUL byte; the reader must not.
  EXPECT_CORRUPT(Raw(std::string("{}\0\0\0", 5)), "header is not valid JSON (byte 2): raw NUL byte");
  EXPECT_CORRUPT(Raw(std::string("{}\0{\"x\":", 7)), "raw NUL byte");
  EXPECT_CORRUPT(Raw(std::string("{\"a\0\":1}", 8)), "raw NUL byte");
  EXPECT_CORRUPT(Raw("\xef\xbb\xbf{}"), "header is not valid JSON (byte 0): byte order mark");
  EXPECT_CORRUPT(Raw(R"({"a":1,})"), "header is not valid JSON");
  EXPECT_CORRUPT(Raw(R"({"__metadata__":{"k":"\ud800"}})"), "header is not valid JSON");
  EXPECT_CORRUPT(Raw(R"({"w":{"shape":[1e999]}})"), "header is not valid JSON");
}

TEST(SafetensorsReader, NestingBomb) {
  const size_t depth = 1'000'000;
  EXPECT_CORRUPT(Raw(std::string(depth, '[') + std::string(depth, ']')),
                 "header JSON nests deeper than 64 levels");
  std::string objects;
  for (size_t i = 0; i < 100'000; ++i) objects += "{\"a\":";
  EXPECT_CORRUPT(Raw(objects), "nests deeper than 64 levels");
}

TEST(SafetensorsReader, HeaderNotAnObject) {
  EXPECT_CORRUPT(Raw("[]"), "header JSON is an array, not an object");
  EXPECT_CORRUPT(Raw("\"x\"   "), "header JSON is a string, not an object");
  EXPECT_CORRUPT(Raw("null"), "header JSON is a null, not an object");
}

TEST(SafetensorsReader, DuplicateKeys) {
  const std::string w = R"({"dtype":"U8","shape":[0],"data_offsets":[0,0]})";
  EXPECT_CORRUPT(Raw("{\"w\":" + w + ",\"w\":" + w + "}"),
                 "duplicate key 'w' in the top-level object (tensor names must be unique)");
  EXPECT_CORRUPT(Raw(One(R"("dtype":"U8","dtype":"U8","shape":[0],"data_offsets":[0,0])")),
                 "duplicate key 'dtype' in 'w'");
  EXPECT_CORRUPT(Raw(R"({"__metadata__":{"k":"a","k":"b"}})"),
                 "duplicate key 'k' in '__metadata__'");
  EXPECT_CORRUPT(Raw(R"({"__metadata__":{},"__metadata__":{}})"), "duplicate key '__metadata__'");
  EXPECT_CORRUPT(Raw(R"({"w":{"shape":[{"a":1,"a":2}]}})"), "in an object inside an array");
}

TEST(SafetensorsReader, EntryNotAnObject) {
  EXPECT_CORRUPT(Raw(R"({"w":[0,0]})"), "tensor 'w': entry is an array, not an object");
  EXPECT_CORRUPT(Raw(R"({"w":"U8"})"), "tensor 'w': entry is a string, not an object");
}

TEST(SafetensorsReader, MissingField) {
  EXPECT_CORRUPT(Raw(One(R"("shape":[0],"data_offsets":[0,0])")), "tensor 'w': missing field 'dtype'");
  EXPECT_CORRUPT(Raw(One(R"("dtype":"U8","data_offsets":[0,0])")), "tensor 'w': missing field 'shape'");
  EXPECT_CORRUPT(Raw(One(R"("dtype":"U8","shape":[0])")), "tensor 'w': missing field 'data_offsets'");
}

TEST(SafetensorsReader, UnexpectedField) {
  EXPECT_CORRUPT(Raw(One(R"("dtype":"U8","shape":[0],"data_offsets":[0,0],"align":8)")),
                 "tensor 'w': unexpected field 'align' (allowed: dtype, shape, data_offsets)");
}

TEST(SafetensorsReader, BadDType) {
  EXPECT_CORRUPT(Raw(One(R"("dtype":2,"shape":[0],"data_offsets":[0,0])")),
                 "tensor 'w': dtype is a number, not a string");
  EXPECT_CORRUPT(Raw(One(R"("dtype":"bf16","shape":[0],"data_offsets":[0,0])")),
                 "tensor 'w': unknown dtype 'bf16'");
  EXPECT_CORRUPT(Raw(One(R"("dtype":"C64","shape":[0],"data_offsets":[0,0])")),
                 "tensor 'w': unknown dtype 'C64'");
  // Valid safetensors, but packed below a byte: refused as unsupported.
  for (const char* sub : {"F4", "F6_E2M3", "F6_E3M2"}) {
    EXPECT_ERROR(ParseStatus(Raw(One(R"("dtype":")" + std::string(sub) +
                                     R"(","shape":[0],"data_offsets":[0,0])"))),
                 ErrorCode::kUnsupported, "packs elements below one byte");
  }
}

TEST(SafetensorsReader, BadShape) {
  auto with_shape = [](std::string shape) {
    return Raw(One(R"("dtype":"U8","shape":)" + shape + R"(,"data_offsets":[0,0])"));
  };
  EXPECT_CORRUPT(with_shape("{}"), "tensor 'w': shape is an object, not an array");
  EXPECT_CORRUPT(with_shape("3"), "tensor 'w': shape is a number, not an array");
  EXPECT_CORRUPT(with_shape("[2,-1]"), "shape[1] is -1, not a non-negative integer below 2^64");
  EXPECT_CORRUPT(with_shape("[1.5]"), "shape[0] is 1.5, not a non-negative integer");
  EXPECT_CORRUPT(with_shape("[1.0]"), "shape[0] is 1.0, not a non-negative integer");
  EXPECT_CORRUPT(with_shape("[18446744073709551616]"), "shape[0] is 1.8446744073709552e+19, not");
  EXPECT_CORRUPT(with_shape("[\"3\"]"), "shape[0] is \"3\", not a non-negative integer");
  EXPECT_CORRUPT(with_shape("[null]"), "shape[0] is null, not");
  // The largest uint64 is a fine dimension (next to a zero one).
  EXPECT_TRUE(ParseBytes(with_shape("[18446744073709551615,0]")).ok());
}

TEST(SafetensorsReader, BadDataOffsets) {
  auto with_offsets = [](std::string offsets) {
    return Raw(One(R"("dtype":"U8","shape":[2],"data_offsets":)" + offsets), 2);
  };
  EXPECT_CORRUPT(with_offsets("5"), "tensor 'w': data_offsets is 5, not an array of exactly 2 integers");
  EXPECT_CORRUPT(with_offsets("[0]"), "data_offsets is [0], not an array of exactly 2 integers");
  EXPECT_CORRUPT(with_offsets("[0,1,2]"), "not an array of exactly 2 integers");
  EXPECT_CORRUPT(with_offsets("{}"), "not an array of exactly 2 integers");
  EXPECT_CORRUPT(with_offsets("[-1,1]"), "data_offsets[0] is -1, not a non-negative integer");
  EXPECT_CORRUPT(with_offsets("[0,2.0]"), "data_offsets[1] is 2.0, not a non-negative integer");
  EXPECT_CORRUPT(with_offsets("[2,0]"), "tensor 'w': data_offsets [2, 0] end before they begin");
}

TEST(SafetensorsReader, ElementCountOverflow) {
  EXPECT_CORRUPT(Raw(One(R"("dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0])")),
                 "tensor 'w': shape [4294967296, 4294967296] element count overflows 64 bits");
  EXPECT_CORRUPT(Raw(One(R"("dtype":"BF16","shape":[9223372036854775808],"data_offsets":[0,0])")),
                 "tensor 'w': shape [9223372036854775808] x BF16 byte size overflows 64 bits");
}

TEST(SafetensorsReader, SpanDisagreesWithShape) {
  EXPECT_CORRUPT(Raw(One(R"("dtype":"BF16","shape":[3],"data_offsets":[0,10])"), 10),
                 "t.safetensors: tensor 'w': data_offsets [0, 10] span 10 bytes but shape [3] x "
                 "BF16 needs 6");
  EXPECT_CORRUPT(Raw(One(R"("dtype":"F64","shape":[],"data_offsets":[0,0])")),
                 "span 0 bytes but shape [] x F64 needs 8");
}

TEST(SafetensorsReader, OffsetsBeyondData) {
  EXPECT_CORRUPT(Raw(One(R"("dtype":"BF16","shape":[3],"data_offsets":[0,6])"), 4),
                 "tensor 'w': data_offsets [0, 6] extend past the 4-byte data section");
  EXPECT_CORRUPT(
      Raw(One(R"("dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615])")),
      "extend past the 0-byte data section");
}

TEST(SafetensorsReader, Gap) {
  EXPECT_CORRUPT(Raw(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                     R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})", 6),
                 "tensor 'b': data_offsets [4, 6] leave a gap: bytes [2, 4) belong to no tensor");
  EXPECT_CORRUPT(Raw(One(R"("dtype":"U8","shape":[2],"data_offsets":[2,4])"), 4),
                 "leave a gap: bytes [0, 2) belong to no tensor");
}

TEST(SafetensorsReader, Overlap) {
  EXPECT_CORRUPT(Raw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                     R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6),
                 "tensor 'b': data_offsets [2, 6] overlap tensor 'a', which ends at 4");
  // Same range twice.
  EXPECT_CORRUPT(Raw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                     R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4),
                 "tensor 'b': data_offsets [0, 4] overlap tensor 'a'");
  // A zero-size tensor may sit at a boundary, not inside another tensor.
  EXPECT_CORRUPT(Raw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                     R"("z":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})", 4),
                 "tensor 'z': data_offsets [2, 2] overlap tensor 'a'");
  EXPECT_TRUE(ParseBytes(Raw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("y":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
                             R"("z":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}})", 4))
                  .ok());
}

TEST(SafetensorsReader, TrailingBytes) {
  EXPECT_CORRUPT(Raw(One(R"("dtype":"U8","shape":[2],"data_offsets":[0,2])"), 3),
                 "data section is 3 bytes but tensors cover only 2 (trailing bytes)");
  EXPECT_CORRUPT(Raw("{}", 1), "data section is 1 bytes but tensors cover only 0 (trailing bytes)");
}

TEST(SafetensorsReader, BadMetadata) {
  EXPECT_CORRUPT(Raw(R"({"__metadata__":"x"})"), "__metadata__ is a string, not an object");
  EXPECT_CORRUPT(Raw(R"({"__metadata__":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})"),
                 "__metadata__ key 'data_offsets' has an array value; metadata values must be strings");
  EXPECT_CORRUPT(Raw(R"({"__metadata__":{"k":1}})"),
                 "__metadata__ key 'k' has a number value; metadata values must be strings");
}

TEST(SafetensorsReader, EmptyTensorName) {
  EXPECT_CORRUPT(Raw(R"({"":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})"),
                 "tensor with an empty name");
}

TEST(SafetensorsReader, MessagesEscapeControlBytesAndCutLongNames) {
  Status s = ParseStatus(Raw(R"({"a\nb":1})"));
  EXPECT_NE(s.message().find("tensor 'a\\x0ab'"), std::string::npos) << s.message();
  s = ParseStatus(Raw("{\"" + std::string(10'000, 'n') + "\":1}"));
  EXPECT_LT(s.message().size(), 400u) << s.message();
}

// --- Robustness ------------------------------------------------------------

std::vector<uint8_t> SmallValidFile() {
  static const std::vector<uint8_t> a = Pattern(6, 9), b = Pattern(8, 4);
  std::vector<TensorView> views = {{"a", DType::kBF16, {3}, a},
                                   {"e", DType::kF32, {0}, {}},
                                   {"b", DType::kF64, {}, b}};
  return SerializeSafetensors({{"k", "v"}}, views).value();
}

TEST(SafetensorsReader, EveryTruncationFails) {
  const std::vector<uint8_t> full = SmallValidFile();
  ASSERT_TRUE(ParseBytes(full).ok());
  for (size_t n = 0; n < full.size(); ++n) {
    Status s = ParseStatus(std::vector<uint8_t>(full.begin(), full.begin() + n));
    EXPECT_EQ(s.code(), ErrorCode::kCorruption) << "prefix " << n << ": " << s.ToString();
  }
  std::vector<uint8_t> longer = full;
  longer.push_back(0);
  EXPECT_CORRUPT(longer, "(trailing bytes)");
}

TEST(SafetensorsReader, ByteFlipsNeverCrash) {
  const std::vector<uint8_t> full = SmallValidFile();
  for (size_t i = 0; i < full.size(); ++i) {
    for (uint8_t mask : {0x01, 0x08, 0x20, 0x80, 0xff}) {
      std::vector<uint8_t> bytes = full;
      bytes[i] ^= mask;
      auto file = ParseBytes(bytes);
      if (file.ok()) {
        for (const TensorView& t : file->tensors()) {
          EXPECT_EQ(t.data.size(), CheckedElementCount(t.shape).value() * DTypeSize(t.dtype));
        }
      } else {
        EXPECT_NE(file.status().code(), ErrorCode::kInternal) << file.status().ToString();
      }
    }
  }
}

// The checked-in fuzz seeds: ok_* must parse, bad_* must not.
TEST(SafetensorsReader, SeedCorpus) {
  const fs::path dir = fs::path(DS_SOURCE_DIR) / "tests/fuzz/corpus/safetensors";
  size_t ok = 0, bad = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename();
    std::ifstream in(e.path(), std::ios::binary);
    std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    Status s = ParseStatus(bytes);
    if (name.rfind("ok_", 0) == 0) {
      EXPECT_TRUE(s.ok()) << name << ": " << s.ToString();
      ++ok;
    } else if (name.rfind("bad_", 0) == 0) {
      EXPECT_FALSE(s.ok()) << name;
      ++bad;
    }
  }
  EXPECT_GE(ok, 4u);
  EXPECT_GE(bad, 3u);
}

}  // namespace
}  // namespace deltasync
