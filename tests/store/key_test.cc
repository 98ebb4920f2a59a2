// ValidateKey: every rule of store.h, each with the words a person sees.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "deltasync/store.h"

namespace deltasync {
namespace {

TEST(ValidateKeyTest, AcceptsOrdinaryKeys) {
  for (const std::string& key : std::vector<std::string>{
           "manifest.json", "anchors/step_000010.safetensors", "deltas/step_1000000.safetensors", "a",
           ".hidden", "...", "a..b/c.", "sp ace/ü", ".tmp", "a.tmp-b", "x/.tmpfile", std::string(1024, 'k')}) {
    EXPECT_TRUE(ValidateKey(key).ok()) << key << ": " << ValidateKey(key).ToString();
  }
}

TEST(ValidateKeyTest, RefusesEachRuleWithItsReason) {
  struct Case {
    std::string key;
    std::string reason;
  };
  std::vector<Case> cases = {
      {"", "empty"},
      {std::string(1025, 'k'), "1025 bytes, more than the limit of 1024"},
      {std::string("a\0b", 3), "contains a NUL byte"},
      {"a\\b", "backslash"},
      {"/etc/passwd", "starts with '/'"},
      {"deltas/", "ends with '/'"},
      {"a//b", "empty segment"},
      {"./a", "'.' segment"},
      {"a/./b", "'.' segment"},
      {".", "'.' segment"},
      {"..", "'..' segment"},
      {"../x", "'..' segment"},
      {"a/../../etc", "'..' segment"},
      {"a/..", "'..' segment"},
      {".tmp-host-1-0123456789abcdef-x", "reserved for temporary files"},
      {"ds/anchors/.tmp-x", "reserved for temporary files"},
      {".tmp-/y", "reserved for temporary files"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.key));
    Status s = ValidateKey(c.key);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(s.message().find(c.reason), std::string::npos) << s.message();
    EXPECT_EQ(s.message().rfind("invalid key '", 0), 0u) << s.message();
  }
}

TEST(ValidateKeyTest, MessagesStayPrintableAndShort) {
  Status nul = ValidateKey(std::string("a\0b", 3));
  EXPECT_NE(nul.message().find("'a\\x00b'"), std::string::npos) << nul.message();
  Status longkey = ValidateKey(std::string(5000, 'k'));
  EXPECT_LT(longkey.message().size(), 200u);
  EXPECT_NE(longkey.message().find("..."), std::string::npos);
}

}  // namespace
}  // namespace deltasync
