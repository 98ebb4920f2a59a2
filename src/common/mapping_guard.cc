#include "common/mapping_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>

#include "common/tsan.h"

namespace deltasync {
namespace {

// Slots are claimed and read without locks: the handler may run in any
// thread at any time, so it only loads atomics. `gen` moves on every guard
// and unguard of a slot: the handler takes a slot's range only when its
// generation was the same before and after reading begin and end (a slot
// freed and claimed again for another mapping meanwhile would otherwise
// give it a range made of both, and zero pages over memory of neither).
enum : int { kFree = 0, kClaimed = 1, kActive = 2 };
struct Slot {
  std::atomic<int> state{kFree};
  std::atomic<uint64_t> gen{0};
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<bool> cut{false};
};
constexpr int kSlots = 1024;
Slot g_slots[kSlots];
struct sigaction g_previous;
uintptr_t g_page = 4096;  // set before the handler is installed

// Passes a SIGBUS that is none of ours on as if this handler were not there.
void PassOn(int sig, siginfo_t* info, void* context) {
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default action: the faulting access runs again and kills the process.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
}

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  const uintptr_t page = g_page;
  for (Slot& s : g_slots) {
    const uint64_t gen = s.gen.load(std::memory_order_acquire);
    if (s.state.load(std::memory_order_acquire) != kActive) continue;
    const uintptr_t begin = s.begin.load(std::memory_order_relaxed);
    const uintptr_t end = s.end.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.gen.load(std::memory_order_relaxed) != gen) continue;  // changed while read
    if (addr < begin || addr >= end) continue;
    // Zero pages from the faulting one to the end (the file is cut there or
    // before), so that one signal covers the rest of the read.
    const uintptr_t from = addr & ~(page - 1);
    void* p = ::mmap(reinterpret_cast<void*>(from), end - from, PROT_READ,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p != MAP_FAILED) {
      s.cut.store(true, std::memory_order_release);
      errno = saved_errno;
      return;
    }
    break;
  }
  errno = saved_errno;
  PassOn(sig, info, context);
}

void Install() {
  g_page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  struct sigaction sa {};
  sa.sa_sigaction = OnSigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

int GuardMapping(const void* addr, size_t len) {
  static std::once_flag installed;
  std::call_once(installed, Install);
  const uintptr_t page = g_page;
  const auto begin = reinterpret_cast<uintptr_t>(addr);
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = g_slots[i];
    int expected = kFree;
    if (!s.state.compare_exchange_strong(expected, kClaimed, std::memory_order_acquire)) continue;
    s.gen.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);  // a seqlock's write side
    s.begin.store(begin, std::memory_order_relaxed);
    s.end.store((begin + len + page - 1) & ~(page - 1), std::memory_order_relaxed);
    s.cut.store(false, std::memory_order_relaxed);
    s.state.store(kActive, std::memory_order_release);
    return i;
  }
  return -1;
}

void UnguardMapping(int slot) {
  if (slot < 0) return;
  g_slots[slot].state.store(kFree, std::memory_order_release);
  g_slots[slot].gen.fetch_add(1, std::memory_order_release);
}

bool MappingCut(int slot) {
  return slot >= 0 && g_slots[slot].cut.load(std::memory_order_acquire);
}

}  // namespace deltasync

#if DS_UNDER_TSAN
// A ThreadSanitizer build: a SIGBUS that is none of ours must end the
// process by the signal, as in every other build (PassOn), not as TSan's
// own handler ends it ("ThreadSanitizer: BUS", exit 66). TSAN_OPTIONS
// still overrides this default.
extern "C" const char* __tsan_default_options() { return "handle_sigbus=0"; }
#endif
