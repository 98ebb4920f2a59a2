// inspect of a part object (inspect_part.h).
#include "inspect_part.h"

#include <cinttypes>
#include <cstdio>
#include <filesystem>

#include "deltasync/manifest.h"
#include "deltasync/parts.h"
#include "deltasync/store.h"

namespace deltasync::cli {
namespace {

// The part index p and count P from the object's file name.
bool ParsePartName(const std::string& name, uint64_t& part, uint64_t& parts) {
  const size_t at = name.rfind(".part_");
  if (at == std::string::npos || !name.starts_with("step_")) return false;
  char tail[16] = {};
  return std::sscanf(name.c_str() + at, ".part_%" SCNu64 "_of_%" SCNu64 ".safetensor%1s", &part, &parts, tail) == 3 &&
         std::string(tail) == "s" && part < parts;
}

// The layout and part index of `key` in the manifest of the bucket at `root`.
bool FindInBucket(const std::string& root, const std::string& key, PartLayout& layout, size_t& part) {
  Result<std::shared_ptr<Store>> store = OpenStore(root, /*create=*/false);
  if (!store.ok()) return false;
  Result<Manifest> manifest = FetchManifest(**store);
  if (!manifest.ok()) return false;
  for (const VersionEntry& v : manifest->versions) {
    for (const ObjectEntry& o : v.objects) {
      for (size_t p = 0; p < o.parts.size(); ++p) {
        if (o.parts[p].key != key) continue;
        const PartLayout* l = manifest->LayoutOf(v);
        if (!l) return false;
        layout = *l;
        part = p;
        return true;
      }
    }
  }
  return false;
}

}  // namespace

nlohmann::ordered_json DescribePartObject(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p = fs::absolute(fs::path(path)).lexically_normal();
  const std::string name = p.filename().string();
  uint64_t part = 0, parts = 0;
  if (!ParsePartName(name, part, parts)) return nullptr;
  nlohmann::ordered_json out = {{"part", part}, {"parts", parts}, {"layout", nullptr}, {"listed", false}};
  nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
  PartLayout layout;
  size_t index = 0;
  const fs::path dir = p.parent_path();
  if (dir.filename() == "parts" && dir.parent_path().filename() == "ds" &&
      FindInBucket(dir.parent_path().parent_path().string(), "ds/parts/" + name, layout, index)) {
    out["part"] = index;
    out["parts"] = layout.parts.size();
    out["layout"] = layout.Digest();
    out["listed"] = true;
    for (const Block& b : layout.parts[index]) {
      const TensorDesc& t = layout.tensors[b.tensor];
      blocks.push_back({{"name", t.name}, {"offset", b.offset}, {"shape", b.shape}, {"full_shape", t.shape}});
    }
    out["blocks"] = std::move(blocks);
  } else {
    out["blocks"] = nullptr;  // offsets and full shapes are only in the bucket's layout
  }
  return out;
}

}  // namespace deltasync::cli
