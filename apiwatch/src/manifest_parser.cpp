#include "manifest_parser.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

namespace kproxy::apiwatch {
namespace {

using nlohmann::json;

struct YamlChunk {
  std::string text;
  std::size_t firstLine = 1;  // 1-based line of the chunk's first line in the file
};

bool isMarker(std::string_view line, std::string_view marker) {
  return line.starts_with(marker) && (line.size() == marker.size() || line[marker.size()] == ' ' ||
                                      line[marker.size()] == '\t' || line[marker.size()] == '\r');
}

/// True when a chunk holds nothing but blank lines, comments and directives.
bool isBlank(std::string_view text) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    std::size_t first = line.find_first_not_of(" \t\r");
    if (first != std::string_view::npos && line[first] != '#' && !(first == 0 && line[0] == '%'))
      return false;
    pos = end + 1;
  }
  return true;
}

// yaml-cpp's LoadAll gives up on the whole stream at the first syntax error, which would lose
// the good documents after it. Document markers can only appear at column 0 (YAML forbids them
// inside content), so splitting on them first lets each document fail on its own.
std::vector<YamlChunk> splitYamlDocuments(std::string_view text) {
  std::vector<YamlChunk> chunks;
  YamlChunk current;
  std::size_t lineNo = 1;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    std::size_t next = end == std::string_view::npos ? text.size() : end + 1;
    std::string_view line =
        text.substr(pos, (end == std::string_view::npos ? text.size() : end) - pos);
    if (isMarker(line, "---") || isMarker(line, "...")) {
      chunks.push_back(std::move(current));
      current = YamlChunk{{}, lineNo};
      if (line.starts_with("---") && line.size() > 3) {
        // "--- {a: 1}" or "--- |": the document starts on the marker line. Blank out the
        // marker so columns (and error positions) stay where the user sees them.
        current.text.append(3, ' ');
        current.text.append(line.substr(3));
        current.text += '\n';
      } else {
        current.firstLine = lineNo + 1;
      }
    } else {
      current.text.append(line);
      current.text += '\n';
    }
    pos = next;
    ++lineNo;
  }
  chunks.push_back(std::move(current));
  return chunks;
}

/// Decodes one document's JSON value: a single object or a List of them.
void decodeDocument(json&& value, std::size_t document, std::size_t line,
                    std::vector<ManifestEntry>& out) {
  if (value.is_null()) return;
  if (value.is_object()) {
    auto kindIt = value.find("kind");
    auto itemsIt = value.find("items");
    if (kindIt != value.end() && kindIt->is_string() && itemsIt != value.end()) {
      const std::string listKind = kindIt->get<std::string>();
      if (listKind.ends_with("List")) {
        if (!itemsIt->is_array()) {
          out.push_back({document, line, std::nullopt,
                         core::makeError(core::ErrorCategory::kDecode,
                                         fmt::format("{}: items: expected an array", listKind))});
          return;
        }
        // Typed lists (ServiceList, ...) from `kubectl get --raw` leave kind and apiVersion
        // off their items; a generic List always sets them.
        std::string itemKind = listKind.substr(0, listKind.size() - 4);
        json apiVersion = value.value("apiVersion", json());
        std::size_t index = 0;
        for (auto& item : *itemsIt) {
          if (item.is_object() && !itemKind.empty()) {
            if (!item.contains("kind")) item["kind"] = itemKind;
            if (!item.contains("apiVersion") && apiVersion.is_string())
              item["apiVersion"] = apiVersion;
          }
          out.push_back({document, line, index++, decodeObject(item)});
        }
        return;
      }
    }
  }
  out.push_back({document, line, std::nullopt, decodeObject(value)});
}

std::size_t lineOfOffset(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  return 1 + static_cast<std::size_t>(std::count(
                 text.begin(), text.begin() + static_cast<std::ptrdiff_t>(offset), '\n'));
}

void parseJson(std::string_view text, std::vector<ManifestEntry>& out) {
  if (isBlank(text)) return;
  json value;
  try {
    value = json::parse(text);
  } catch (const json::parse_error& e) {
    out.push_back({1, lineOfOffset(text, e.byte == 0 ? 0 : e.byte - 1), std::nullopt,
                   core::makeError(core::ErrorCategory::kDecode,
                                   fmt::format("JSON syntax error: {}", e.what()))});
    return;
  }
  decodeDocument(std::move(value), 1, 1, out);
}

void parseYaml(std::string_view text, std::vector<ManifestEntry>& out) {
  std::size_t document = 0;
  for (auto& chunk : splitYamlDocuments(text)) {
    if (isBlank(chunk.text)) continue;
    ++document;
    YAML::Node node;
    try {
      node = YAML::Load(chunk.text);
    } catch (const YAML::Exception& e) {
      std::size_t line =
          chunk.firstLine + (e.mark.line >= 0 ? static_cast<std::size_t>(e.mark.line) : 0);
      out.push_back(
          {document, line, std::nullopt,
           core::makeError(core::ErrorCategory::kDecode,
                           fmt::format("YAML syntax error at line {}: {}", line, e.msg))});
      continue;
    }
    auto value = yamlToJson(node);
    if (!value) {
      out.push_back({document, chunk.firstLine, std::nullopt, std::unexpected(value.error())});
      continue;
    }
    decodeDocument(std::move(*value), document, chunk.firstLine, out);
  }
}

}  // namespace

std::vector<ManifestEntry> parseManifest(std::string_view text, ManifestFormat format) {
  std::vector<ManifestEntry> out;
  if (format == ManifestFormat::kJson) {
    parseJson(text, out);
  } else {
    parseYaml(text, out);
  }
  return out;
}

}  // namespace kproxy::apiwatch
