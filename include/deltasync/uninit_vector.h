// A std::vector whose growth leaves new elements uninitialised, for buffers
// that are written before they are read (an undo log: CompactUndo).
//
// std::vector<T>::resize value-initialises (zero-fills) every new element:
// for a log of 100+ MB, one pass over fresh memory on the calling thread
// (and a page fault per 4 KiB) before anything is written. Its allocator
// here default-initialises instead, a no-op for trivial types: resize(n)
// only moves the end, and the new elements hold whatever the memory held
// (contents below the old size are kept, as std::vector keeps them).
#pragma once

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace deltasync {

template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  DefaultInitAllocator() noexcept = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)

  // Default-initialised (resize, the constructor of n elements): for a
  // trivial type nothing is written.
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T, typename U>
bool operator==(const DefaultInitAllocator<T>&, const DefaultInitAllocator<U>&) noexcept {
  return true;
}

template <typename T>
  requires std::is_trivially_copyable_v<T> && std::is_trivially_default_constructible_v<T>
using UninitVector = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace deltasync
