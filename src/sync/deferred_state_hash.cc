#include "sync/deferred_state_hash.h"

#include <atomic>
#include <cstdio>
#include <exception>
#include <new>
#include <string>

namespace deltasync {
namespace {

std::atomic<DeferredStateHash::Hook> hook_for_testing{nullptr};

}  // namespace

void DeferredStateHash::SetHookForTesting(Hook hook) { hook_for_testing.store(hook); }

DeferredStateHash::~DeferredStateHash() {
  if (thread_.joinable()) thread_.join();
}

void DeferredStateHash::RunSum() noexcept {
  // No exception leaves the sum's thread (it would end the process): what
  // it throws becomes the version's error, kept without allocating.
  auto failed = [this](const char* what) {
    std::snprintf(error_, sizeof error_, "%s", what != nullptr && what[0] != '\0' ? what : "an exception");
  };
  try {
    if (Hook hook = hook_for_testing.load()) hook();
    change_ = sum_();
  } catch (const std::bad_alloc&) {
    failed("out of memory");
  } catch (const std::exception& e) {
    failed(e.what());
  } catch (...) {
    failed("an unknown exception");
  }
  done_ = true;
}

void DeferredStateHash::Start() {
  if (!pending() || done_ || thread_.joinable()) return;
  try {
    thread_ = std::thread([this] { RunSum(); });
  } catch (const std::exception&) {  // std::system_error, std::bad_alloc
    RunSum();  // no thread: the slower route, the same sum
  }
}

Result<StateHash> DeferredStateHash::Join() {
  if (!pending()) return StateHash{};
  if (thread_.joinable()) {
    thread_.join();
  } else if (!done_) {
    RunSum();
  }
  sum_ = nullptr;
  done_ = false;
  if (error_[0] != '\0') {
    Status failed = Status::Internal(std::string("the state hash's change could not be summed (") + error_ + ")");
    error_[0] = '\0';
    return failed;
  }
  return change_;
}

}  // namespace deltasync
