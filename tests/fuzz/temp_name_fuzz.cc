// Fuzz target for temporary file names (ParseTempName, src/common/temp_file.cc):
// the names of a directory's entries, which any process sharing the
// directory may have created. A name that parses as a dead writer's
// temporary is deleted (RemoveDeadWritersTemporaries, the daemon's --out
// cleanup), so it must be read exactly. Properties, per input:
//   1. arbitrary bytes never crash ParseTempName;
//   2. an accepted name has a pid > 0, starts with a temporary prefix, and
//      holds its base where its format puts it; a new-format name starts
//      with its host (no '-' in it);
//   3. the name TempPathFor writes for a target named by the input parses to
//      this host, this process, and the target's basename (its first 160
//      bytes).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "deltasync/temp_file.h"
#include "fuzz/fuzz_check.h"

namespace {

using namespace deltasync;

using deltasync::fuzz::Check;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view name(reinterpret_cast<const char*>(data), size);
  if (std::optional<TempNameInfo> info = ParseTempName(name)) {
    Check(info->pid > 0 && IsTempName(name), "an accepted name without a writer");
    if (info->legacy) {
      Check(name.starts_with(std::string(kLegacyTempNamePrefix) + info->base + "."), "the base is not the name's");
    } else {
      Check(name.ends_with(info->base), "the base is not the name's end");
      Check(!info->host.empty() && info->host.find('-') == std::string::npos, "a host with '-'");
      Check(name.starts_with(std::string(kTempNamePrefix) + info->host + "-"), "the name does not start with its host");
    }
  }

  // A target named by the input (no '/', no NUL: a basename).
  if (name.empty() || name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos) return 0;
  const std::string path = TempPathFor("/dir/" + std::string(name));
  Check(path.starts_with("/dir/"), "the temporary is not beside its target");
  std::optional<TempNameInfo> mine = ParseTempName(std::string_view(path).substr(5));
  Check(mine.has_value(), "a name TempPathFor wrote does not parse");
  // TempPathFor keeps the first 160 bytes of the basename (kTempBaseBytes).
  Check(!mine->legacy && mine->host == TempNameHost() && mine->pid == static_cast<long>(::getpid()) &&
            mine->base == std::string(name.substr(0, 160)),
        "a name TempPathFor wrote parses to another writer or target");
  return 0;
}
