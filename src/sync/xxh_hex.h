// The manifest's hex form of an XXH3-128 digest (internal to src/sync):
// canonical, big-endian, high 64 bits first, as xxhsum prints it. Xxh3Hex
// (manifest.h) hashes whole buffers with it; retention_routes.cc hashes an
// object in slices and formats its digest with it.
#pragma once

#include <xxhash.h>

#include <string>

namespace deltasync {

std::string Xxh128Hex(const XXH128_hash_t& hash);

}  // namespace deltasync
