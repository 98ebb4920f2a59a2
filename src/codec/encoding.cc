// Index encoding names as they appear in a patch's __metadata__["encoding"].
#include "deltasync/patch.h"

namespace deltasync {

std::string_view EncodingName(IndexEncoding encoding) {
  switch (encoding) {
    case IndexEncoding::kRaw: return "raw";
    case IndexEncoding::kGapDelta: return "gap_delta";
    case IndexEncoding::kCompact: return "compact";
  }
  return "unknown";
}

Result<IndexEncoding> ParseEncoding(std::string_view name) {
  if (name == "raw") return IndexEncoding::kRaw;
  if (name == "gap_delta") return IndexEncoding::kGapDelta;
  if (name == "compact") return IndexEncoding::kCompact;
  if (name == "nvcomp_cascaded") {
    // TRL's third encoding is an nvCOMP Cascaded bitstream; decoding it needs
    // the GPU library, which deltasync does not link.
    return Status::Unsupported(
        "encoding nvcomp_cascaded needs nvCOMP (a GPU codec); re-publish with --encoding gap_delta or raw");
  }
  return Status::InvalidArgument("unknown index encoding '" + std::string(name) +
                                 "' (expected compact, gap_delta or raw)");
}

}  // namespace deltasync
