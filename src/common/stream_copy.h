// A copy into memory that will not be read soon (internal).
//
// A plain memcpy into memory that is not in any cache first reads every
// destination line (the store's read-for-ownership), then writes it: two
// trips to memory a line. Non-temporal stores write whole lines without the
// read. Measured on the Intel Xeon host (KVM, 2 vCPUs), 512 KiB pieces from
// a hot buffer into 1 GiB of reused (faulted-in, uncached) pages: glibc's
// memcpy 0.15-0.24 s per GiB, non-temporal SSE2 stores 0.08-0.12 s. The
// copied bytes end up in memory, not in a cache: use it only where the
// destination is too large to stay cached anyway (a large download's part).
#pragma once

#include <cstddef>
#include <cstdint>

namespace deltasync {

// Copies n bytes from src to dst (which must not overlap) with non-temporal
// stores where the CPU has them (x86-64: SSE2, always), memcpy elsewhere.
// The stores are fenced before it returns: another thread that synchronizes
// with this one afterwards sees them like any other store.
void CopyToUncached(uint8_t* dst, const uint8_t* src, size_t n);

}  // namespace deltasync
