// A pass-through Store that can be told to fail, for tests (the role of
// LevelDB's EnvWrapper + fault-injection env): the code under test runs
// unchanged against a real LocalStore underneath.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "deltasync/store.h"

namespace deltasync::testing {

class FaultStore : public Store {
 public:
  explicit FaultStore(std::shared_ptr<Store> base) : base_(std::move(base)) {}

  // Called before every write (Put, PutIfUnchanged) with the key; a non-OK
  // status is returned instead of writing.
  std::function<Status(std::string_view key)> fail_write;
  // Called after a PutIfUnchanged that succeeded: a non-OK status is returned
  // although the write landed (a response lost, then a retry answered 412).
  std::function<Status(std::string_view key)> fail_after_conditional_write;
  // Called before every read (Get, GetRange, GetVersioned).
  std::function<Status(std::string_view key)> fail_read;

  Status Put(std::string_view key, std::span<const ByteSpan> parts) override {
    if (fail_write) DS_RETURN_IF_ERROR(fail_write(key));
    return base_->Put(key, parts);
  }
  using Store::Put;
  Result<Blob> Get(std::string_view key) override {
    if (fail_read) DS_RETURN_IF_ERROR(fail_read(key));
    return base_->Get(key);
  }
  Result<Blob> GetRange(std::string_view key, uint64_t offset, uint64_t length) override {
    if (fail_read) DS_RETURN_IF_ERROR(fail_read(key));
    return base_->GetRange(key, offset, length);
  }
  Result<uint64_t> Size(std::string_view key) override { return base_->Size(key); }
  Result<std::vector<std::string>> List(std::string_view prefix) override { return base_->List(prefix); }
  Status Delete(std::string_view key) override { return base_->Delete(key); }
  std::string Describe() const override { return base_->Describe(); }
  Result<Versioned> GetVersioned(std::string_view key) override {
    if (fail_read) DS_RETURN_IF_ERROR(fail_read(key));
    return base_->GetVersioned(key);
  }
  // The base's own Token (a HEAD on S3), failing as reads do.
  Result<std::string> Token(std::string_view key) override {
    if (fail_read) DS_RETURN_IF_ERROR(fail_read(key));
    return base_->Token(key);
  }
  Result<std::string> PutIfUnchanged(std::string_view key, std::span<const ByteSpan> parts,
                                     const std::optional<std::string>& expected_token) override {
    if (fail_write) DS_RETURN_IF_ERROR(fail_write(key));
    Result<std::string> token = base_->PutIfUnchanged(key, parts, expected_token);
    if (token.ok() && fail_after_conditional_write) DS_RETURN_IF_ERROR(fail_after_conditional_write(key));
    return token;
  }

 private:
  std::shared_ptr<Store> base_;
};

}  // namespace deltasync::testing
