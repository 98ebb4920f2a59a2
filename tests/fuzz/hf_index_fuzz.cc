// Fuzz target for the index of a Hugging Face model folder
// (model.safetensors.index.json, read by ReadHfFolder in
// src/format/hf_folder_reader.cc). The input is the index; the folder holds
// it and one fixed shard with tensors "a" and "b". Properties, per input:
//   1. arbitrary bytes never crash ReadHfFolder;
//   2. a folder that reads has an index whose weight_map names exactly the
//      shard's tensors, each in the shard's file, and the folder's tensors are
//      the shard's, whole;
//   3. the index travels as a side file, byte for byte.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deltasync/hf_folder.h"
#include "deltasync/safetensors.h"
#include "fuzz/fuzz_check.h"

namespace {

using namespace deltasync;

constexpr const char* kShard = "model-00001-of-00001.safetensors";

using deltasync::fuzz::Check;

struct Folder {
  std::string dir;
  std::vector<uint8_t> a{1, 2, 3, 4}, b{5, 6};
  Folder() {
    dir = (std::filesystem::temp_directory_path() / ("deltasync-hf-fuzz-" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir);
    std::vector<TensorView> views{{"a", DType::kBF16, {2}, a}, {"b", DType::kU8, {2}, b}};
    Check(WriteSafetensorsFile(dir + "/" + kShard, {}, views).ok(), "cannot write the shard");
  }
  ~Folder() { std::filesystem::remove_all(dir); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Folder folder;
  {
    std::ofstream out(folder.dir + "/" + std::string(kHfIndexFile), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    Check(out.good(), "cannot write the index");
  }
  Result<HfFolder> read = ReadHfFolder(folder.dir);
  if (!read.ok()) return 0;

  const nlohmann::json index = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  Check(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
        "an index without a weight_map object was accepted");
  const nlohmann::json& map = index["weight_map"];
  Check(map.size() == 2 && map.value("a", "") == kShard && map.value("b", "") == kShard,
        "the weight_map does not name exactly the shard's tensors");
  Check(read->tensors.size() == 2 && read->tensors[0].name == "a" && read->tensors[1].name == "b",
        "the folder's tensors are not the shard's");
  Check(std::equal(read->tensors[0].data.begin(), read->tensors[0].data.end(), folder.a.begin(), folder.a.end()) &&
            std::equal(read->tensors[1].data.begin(), read->tensors[1].data.end(), folder.b.begin(), folder.b.end()),
        "the folder's tensor bytes are not the shard's");
  bool carried = false;
  for (const SideFile& f : read->side_files) {
    if (f.name != kHfIndexFile) continue;
    carried = std::equal(f.bytes.bytes().begin(), f.bytes.bytes().end(), data, data + size);
  }
  Check(carried, "the index does not travel as a side file, byte for byte");
  return 0;
}
