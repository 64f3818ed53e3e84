#include "manifest_parser.h"

#include <algorithm>
#include <functional>
#include <optional>
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

/// List items already decoded while the text was parsed, by index; see parseJson.
using EagerItems = std::vector<std::optional<core::Result<DecodedObject>>>;

/// Whether decodeDocument reads `value` as a List (its items one by one).
bool isListDocument(const json& value) {
  if (!value.is_object()) return false;
  auto kindIt = value.find("kind");
  return kindIt != value.end() && kindIt->is_string() && value.contains("items") &&
         kindIt->get_ref<const std::string&>().ends_with("List");
}

/// Decodes one document's JSON value: a single object or a List of them. `eager` holds the
/// items decoded during the parse (their place in `value` is a null).
void decodeDocument(json&& value, std::size_t document, std::size_t line,
                    std::vector<ManifestEntry>& out, EagerItems* eager = nullptr) {
  if (value.is_null()) return;
  if (isListDocument(value)) {
    auto itemsIt = value.find("items");
    const std::string listKind = value.find("kind")->get<std::string>();
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
    out.reserve(out.size() + itemsIt->size());  // a List may hold a whole cluster
    std::size_t index = 0;
    for (auto& item : *itemsIt) {
      if (eager != nullptr && index < eager->size() && (*eager)[index].has_value()) {
        out.push_back({document, line, index, std::move(*(*eager)[index])});
        ++index;
        continue;
      }
      if (item.is_object() && !itemKind.empty()) {
        if (!item.contains("kind")) item["kind"] = itemKind;
        if (!item.contains("apiVersion") && apiVersion.is_string()) item["apiVersion"] = apiVersion;
      }
      out.push_back({document, line, index++, decodeObject(item)});
    }
    return;
  }
  out.push_back({document, line, std::nullopt, decodeObject(value)});
}

std::size_t lineOfOffset(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  return 1 + static_cast<std::size_t>(std::count(
                 text.begin(), text.begin() + static_cast<std::ptrdiff_t>(offset), '\n'));
}

void addSyntaxError(std::string_view text, const json::parse_error& e,
                    std::vector<ManifestEntry>& out) {
  out.push_back({1, lineOfOffset(text, e.byte == 0 ? 0 : e.byte - 1), std::nullopt,
                 core::makeError(core::ErrorCategory::kDecode,
                                 fmt::format("JSON syntax error: {}", e.what()))});
}

// A file holding a whole cluster as one List would be held as a JSON tree several times the
// size of its text, next to every object decoded from it. So the items of the top-level
// "items" array are decoded as soon as each is parsed and their tree is dropped (a null keeps
// its place), when that cannot change the outcome: the item names its own kind and apiVersion
// (the List's defaults do not apply to it), and the document is not already known to be
// something else than a List. Should the document turn out not to be a List after all (or to
// have a second "items"), it is parsed again the ordinary way.
class EagerListDecoder {
 public:
  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    using Event = json::parse_event_t;
    if (depth == 1) {
      if (event == Event::key) {
        rootKey_ = parsed.is_string() ? parsed.get<std::string>() : std::string();
        if (rootKey_ == "items" && sawItems_) redo_ = true;
      } else if (event == Event::value && rootKey_ == "kind") {
        rootKindKnown_ = true;
        rootIsList_ = parsed.is_string() && parsed.get_ref<const std::string&>().ends_with("List");
      } else if (event == Event::array_start && rootKey_ == "items") {
        sawItems_ = true;
        inItems_ = !rootKindKnown_ || rootIsList_;
        index_ = 0;
      } else if (event == Event::array_end) {
        inItems_ = false;
      }
      return true;
    }
    if (depth != 2 || !inItems_ || redo_) return true;
    if (event != Event::object_end && event != Event::array_end && event != Event::value)
      return true;
    const std::size_t index = index_++;  // one completed element of the items array
    if (event == Event::object_end && parsed.contains("kind") && parsed.contains("apiVersion")) {
      if (items_.size() <= index) items_.resize(index + 1);
      items_[index] = decodeObject(parsed);
      parsed = nullptr;
    }
    return true;
  }

  /// Items decoded during the parse; valid only when `value` is read as a List.
  EagerItems* itemsFor(const json& value) {
    if (items_.empty()) return nullptr;
    return !redo_ && isListDocument(value) && value.find("items")->is_array() ? &items_ : nullptr;
  }
  bool decodedAny() const { return !items_.empty(); }

 private:
  std::string rootKey_;
  bool rootKindKnown_ = false;
  bool rootIsList_ = false;
  bool sawItems_ = false;
  bool inItems_ = false;
  bool redo_ = false;
  std::size_t index_ = 0;
  EagerItems items_;
};

void parseJson(std::string_view text, std::vector<ManifestEntry>& out) {
  if (isBlank(text)) return;
  EagerListDecoder eager;
  json value;
  try {
    value = json::parse(text, std::ref(eager));
  } catch (const json::parse_error& e) {
    addSyntaxError(text, e, out);
    return;
  }
  if (EagerItems* items = eager.itemsFor(value)) {
    decodeDocument(std::move(value), 1, 1, out, items);
    return;
  }
  if (eager.decodedAny()) {
    // Items were decoded for a document that is not read as a List: parse it again as is.
    try {
      value = json::parse(text);
    } catch (const json::parse_error& e) {
      addSyntaxError(text, e, out);
      return;
    }
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
