// File helpers shared by the core: whole-file writes that readers never see half done, and
// read-only mappings of large files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace collie::detail {

// Writes `text` to PATH.partial and renames it to `path`, so that a reader sees the old
// file or the whole new one. Throws InternalError naming the file.
void writeFileAtomically(const std::string& path, const std::string& text);

// A read-only mapping of a whole regular file. The constructor throws std::runtime_error
// with the reason ("cannot open: No such file or directory"); callers add the file's role.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* bytes() const { return static_cast<const uint8_t*>(data_); }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace collie::detail
