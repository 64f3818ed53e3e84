#pragma once
// Splits the text of one manifest file into Kubernetes objects: multi-document YAML ("---"),
// JSON, and List objects (kind: List, ServiceList, ...). Each document or list item succeeds
// or fails on its own, so one bad document never hides the others.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/apiwatch/decode.h"
#include "kproxy/core/error.h"

namespace kproxy::apiwatch {

enum class ManifestFormat { kYaml, kJson };

/// One object found in a file, or the reason it could not be read.
struct ManifestEntry {
  std::size_t document = 1;         ///< 1-based document number within the file
  std::size_t line = 1;             ///< 1-based line where the document starts
  std::optional<std::size_t> item;  ///< 0-based index in the List's items, if from a List
  core::Result<DecodedObject> object;
};

/// Parses every document of `text`. Blank documents (only whitespace, comments, directives
/// or a YAML null) produce no entry. Never throws.
std::vector<ManifestEntry> parseManifest(std::string_view text, ManifestFormat format);

}  // namespace kproxy::apiwatch
