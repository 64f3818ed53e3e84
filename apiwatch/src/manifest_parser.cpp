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

// Not a syntax error but as fatal to the document: a number too large for a double
// (out_of_range.406, e.g. 1E400). It carries no position.
void addSyntaxError(const json::exception& e, std::vector<ManifestEntry>& out) {
  out.push_back({1, 1, std::nullopt,
                 core::makeError(core::ErrorCategory::kDecode,
                                 fmt::format("JSON error: {}", e.what()))});
}

// A file holding a whole cluster as one List would be held as a JSON tree several times the
// size of its text, next to every object decoded from it. So the items of the top-level
// "items" array are decoded as soon as each is parsed and their tree is dropped (a null keeps
// its place), when that cannot change the outcome: the item names its own kind and apiVersion
// (the List's defaults do not apply to it), and the document is not already known to be
// something else than a List. Should the document turn out not to be a List after all (or to
// have a second "items"), it is parsed again the ordinary way.
//
// A SAX handler around nlohmann's own tree builder rather than json::parse's callback: that
// parser searches the enclosing array for discarded values after every object, which makes a
// List of n items cost n² (a 64 MiB List of Services: 20 s instead of 1).
class EagerListDecoder {
 public:
  using Sax = nlohmann::detail::json_sax_dom_parser<json>;
  explicit EagerListDecoder(json& root) : root_(root), dom_(root) {}

  bool null() { return dom_.null() && nonString(); }
  bool boolean(bool v) { return dom_.boolean(v) && nonString(); }
  bool number_integer(json::number_integer_t v) { return dom_.number_integer(v) && nonString(); }
  bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v) && nonString(); }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    return dom_.number_float(v, s) && nonString();
  }
  bool binary(json::binary_t& v) { return dom_.binary(v) && nonString(); }
  bool string(json::string_t& v) {
    if (depth_ == 1 && rootKey_ == "kind") {  // the only string this needs to read
      rootKindKnown_ = true;
      rootIsList_ = v.ends_with("List");
    }
    return dom_.string(v) && itemDone(false);
  }
  bool key(json::string_t& k) {
    if (depth_ == 1) {
      rootKey_ = k;
      if (rootKey_ == "items" && sawItems_) redo_ = true;
    }
    return dom_.key(k);
  }
  bool start_object(std::size_t n) {
    ++depth_;
    return dom_.start_object(n);
  }
  bool end_object() {
    --depth_;
    return dom_.end_object() && itemDone(true);
  }
  bool start_array(std::size_t n) {
    if (depth_ == 1 && rootKey_ == "items") {
      sawItems_ = true;
      inItems_ = !rootKindKnown_ || rootIsList_;
      index_ = 0;
    }
    ++depth_;
    return dom_.start_array(n);
  }
  bool end_array() {
    --depth_;
    if (depth_ == 1) inItems_ = false;
    return dom_.end_array() && itemDone(false);
  }
  template <typename Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& e) {
    return dom_.parse_error(position, token, e);  // throws e
  }

  /// Items decoded during the parse; valid only when `value` is read as a List.
  EagerItems* itemsFor(const json& value) {
    if (items_.empty()) return nullptr;
    return !redo_ && isListDocument(value) && value.find("items")->is_array() ? &items_ : nullptr;
  }
  bool decodedAny() const { return !items_.empty(); }

 private:
  /// A scalar that is not a string was parsed: as the root's "kind", it is not a List's.
  bool nonString() {
    if (depth_ == 1 && rootKey_ == "kind") {
      rootKindKnown_ = true;
      rootIsList_ = false;
    }
    return itemDone(false);
  }

  /// A value just completed inside the current container: if that container is the root's
  /// items array, it is one item, decoded now when it is an object naming its own kind and
  /// apiVersion.
  bool itemDone(bool isObject) {
    if (depth_ != 2 || !inItems_ || redo_) return true;
    const std::size_t index = index_++;
    if (!isObject) return true;
    auto items = root_.find("items");
    if (items == root_.end() || !items->is_array() || items->empty()) return true;
    json& item = items->back();
    if (item.is_object() && item.contains("kind") && item.contains("apiVersion")) {
      if (items_.size() <= index) items_.resize(index + 1);
      items_[index] = decodeObject(item);
      item = nullptr;
    }
    return true;
  }

  json& root_;
  Sax dom_;
  int depth_ = 0;  // containers open
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
  json value;
  EagerListDecoder eager(value);
  try {
    json::sax_parse(text, &eager);
  } catch (const json::parse_error& e) {
    addSyntaxError(text, e, out);
    return;
  } catch (const json::exception& e) {
    addSyntaxError(e, out);
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
    } catch (const json::exception& e) {
      addSyntaxError(e, out);
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
    auto value = yamlToJson(node, chunk.text.size());
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
