// Checkpoint files in collie's format 1 (one step-S.ckpt file, before ZeRO's shards), which
// collie still loads and no longer writes: "COLLIECK" | u32 version 1 | u64 header length |
// header JSON | tensor bytes | u64 xxh3 of everything before it. For the tests of that
// loading path and the fuzzer's seeds.
#pragma once

#include <ATen/core/Tensor.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace collie::testing {

// A format-1 file of `header` (JSON text, not checked) and `payload`, sealed with its hash.
inline std::string sealFormatOne(const std::string& header, const std::string& payload) {
  std::string file = "COLLIECK";
  const uint32_t version = 1;
  const uint64_t header_size = header.size();
  file.append(reinterpret_cast<const char*>(&version), sizeof(version));
  file.append(reinterpret_cast<const char*>(&header_size), sizeof(header_size));
  file += header;
  file += payload;
  const uint64_t digest = XXH3_64bits(file.data(), file.size());
  file.append(reinterpret_cast<const char*>(&digest), sizeof(digest));
  return file;
}

// The bytes of a format-1 file holding `tensors` (float32 "f32" or int64 "i64").
inline std::string formatOneBytes(int64_t step, const std::string& identity,
                                  const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  nlohmann::json entries = nlohmann::json::array();
  std::string payload;
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor t = tensor.detach().contiguous();
    entries.push_back({{"name", name},
                       {"dtype", t.scalar_type() == at::kLong ? "i64" : "f32"},
                       {"shape", t.sizes().vec()},
                       {"offset", payload.size()},
                       {"bytes", t.nbytes()}});
    payload.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  const std::string header =
      nlohmann::json{{"step", step}, {"identity", identity}, {"tensors", entries}}.dump();
  return sealFormatOne(header, payload);
}

inline void writeFormatOne(const std::string& path, int64_t step, const std::string& identity,
                           const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::ofstream(path, std::ios::binary) << formatOneBytes(step, identity, tensors);
}

}  // namespace collie::testing
