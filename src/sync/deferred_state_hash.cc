#include "sync/deferred_state_hash.h"

#include <atomic>
#include <exception>
#include <new>
#include <system_error>

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
  // it throws becomes the version's error.
  try {
    if (Hook hook = hook_for_testing.load()) hook();
    change_ = sum_();
  } catch (const std::bad_alloc&) {
    error_ = "out of memory";
  } catch (const std::exception& e) {
    error_ = e.what();
    if (error_.empty()) error_ = "an exception";
  } catch (...) {
    error_ = "an unknown exception";
  }
  done_ = true;
}

void DeferredStateHash::Start() {
  if (!pending() || done_ || thread_.joinable()) return;
  try {
    thread_ = std::thread([this] { RunSum(); });
  } catch (const std::system_error&) {
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
  if (!error_.empty()) {
    Status failed = Status::Internal("the state hash's change could not be summed (" + error_ + ")");
    error_.clear();
    return failed;
  }
  return change_;
}

}  // namespace deltasync
