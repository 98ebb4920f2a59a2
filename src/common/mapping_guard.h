// Keeps a file that is cut short while it is mapped from killing the process.
//
// Reading a page of a file mapping past the file's end raises SIGBUS, which
// kills the process: a checkpoint truncated by its writer (a save that
// starts with O_TRUNC) while deltasync reads it would take the publisher down
// mid-publish. A guarded mapping instead gets zero-filled anonymous pages from
// the faulting page to its end, the read goes on, and the mapping is marked
// cut: the reader must then refuse what it read (Blob::cut()). A SIGBUS
// outside every guarded mapping goes to the handler that was installed before
// (or kills the process as it would have).
#pragma once

#include <cstddef>

namespace deltasync {

// Guards [addr, addr + len) (a whole mapping, len rounded up to pages by the
// caller or not). Returns the slot to pass to the functions below, or -1 when
// every slot is taken (the mapping is then unguarded: a cut kills the
// process, as it did before the guard). Installs the SIGBUS handler on the
// first call. Thread-safe.
int GuardMapping(const void* addr, size_t len);
// Stops guarding (before the mapping is unmapped). slot -1: nothing.
void UnguardMapping(int slot);
// Whether a SIGBUS hit the mapping of `slot` since GuardMapping. slot -1: false.
bool MappingCut(int slot);

}  // namespace deltasync
