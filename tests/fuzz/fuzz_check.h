// The fuzz targets' property check: a failed property aborts, which
// libFuzzer reports as a crash and saves the input (the replay driver fails).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace deltasync::fuzz {

inline void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz target: property failed: %s\n", what);
    std::abort();
  }
}

}  // namespace deltasync::fuzz
