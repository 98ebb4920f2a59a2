// `inspect` of a part object (ds/parts/...; docs/format.md, "Parts"): which
// part of which version it is, and its blocks.
#pragma once

#include <nlohmann/json.hpp>
#include <string>


namespace deltasync::cli {

// null unless `path` is named as a part object
// (step_V.anchor|delta_from_B.part_p_of_P.safetensors). Otherwise
// {part, parts, layout, listed, blocks: [{name, offset, shape, full_shape}]}.
// When the file lies in a bucket directory (<bucket>/ds/parts/<name>) whose
// manifest lists it, the part, the layout's digest and the blocks (offsets
// and full shapes) come from there (listed: true); else part and parts come
// from the name, and layout and blocks are null.
nlohmann::ordered_json DescribePartObject(const std::string& path);

}  // namespace deltasync::cli
