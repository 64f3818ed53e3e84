#include "kproxy/core/snapshot.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>

namespace kproxy::core {

// The map is a fixed-depth hash trie: kLevels inner levels of up to 64 children each, indexed
// by successive 6-bit slices of a 64-bit hash, with a small bucket of entries (sorted by key)
// at the bottom. Inner nodes are bitmap-compressed so a sparse trie costs little memory.
// Updating copies the kLevels inner nodes on the path and the one bucket (path copying);
// everything else is shared with the previous version, so with() costs O(1) in the number
// of entries and never touches the old version.
namespace detail {

using Entry = std::shared_ptr<const ServicePortState>;

struct TrieNode {
  std::uint64_t bitmap = 0;                             // inner: which children exist
  std::vector<std::shared_ptr<const TrieNode>> children;  // inner: dense, in bit order
  std::vector<Entry> entries;                           // bucket: sorted by key
};

struct SnapshotTrie {
  std::shared_ptr<const TrieNode> root;
  std::size_t size = 0;
};

}  // namespace detail

namespace {

using detail::Entry;
using detail::TrieNode;
using NodePtr = std::shared_ptr<const TrieNode>;

constexpr int kLevels = 3;
constexpr int kBitsPerLevel = 6;

std::uint64_t hashKey(const ServicePortKey& key) {
  // FNV-1a over the family byte and the name, then a final avalanche (splitmix64) so the top
  // bits used by the trie are well mixed even for similar names.
  std::uint64_t h = 14695981039346656037ull;
  auto mix = [&h](unsigned char c) {
    h ^= c;
    h *= 1099511628211ull;
  };
  mix(static_cast<unsigned char>(key.family));
  for (char c : key.name) mix(static_cast<unsigned char>(c));
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

unsigned slot(std::uint64_t hash, int level) {
  return static_cast<unsigned>((hash >> (64 - kBitsPerLevel * (level + 1))) & 63u);
}

// Position of child `bit` in the dense children vector.
std::size_t denseIndex(std::uint64_t bitmap, unsigned bit) {
  const std::uint64_t below = bit == 0 ? 0 : (bitmap & ((std::uint64_t{1} << bit) - 1));
  return static_cast<std::size_t>(std::popcount(below));
}

const TrieNode* child(const TrieNode& node, unsigned bit) {
  if ((node.bitmap & (std::uint64_t{1} << bit)) == 0) return nullptr;
  return node.children[denseIndex(node.bitmap, bit)].get();
}

template <typename Entries>
auto findInBucket(Entries& entries, const ServicePortKey& key) {
  return std::lower_bound(entries.begin(), entries.end(), key,
                          [](const Entry& e, const ServicePortKey& k) { return e->key < k; });
}

// Returns the updated subtree (nullptr when it became empty) and adjusts `delta` by the change
// in entry count.
NodePtr update(const TrieNode* node, int level, std::uint64_t hash, const ServicePortKey& key,
               const Entry& state, long& delta) {
  if (level == kLevels) {
    auto bucket = std::make_shared<TrieNode>();
    if (node != nullptr) bucket->entries = node->entries;
    auto it = findInBucket(bucket->entries, key);
    const bool present = it != bucket->entries.end() && (*it)->key == key;
    if (state) {
      if (present) {
        *it = state;
      } else {
        bucket->entries.insert(it, state);
        ++delta;
      }
    } else if (present) {
      bucket->entries.erase(it);
      --delta;
    }
    if (bucket->entries.empty()) return nullptr;
    return bucket;
  }

  const unsigned bit = slot(hash, level);
  const TrieNode* old = node != nullptr ? child(*node, bit) : nullptr;
  NodePtr replaced = update(old, level + 1, hash, key, state, delta);

  auto copy = std::make_shared<TrieNode>();
  if (node != nullptr) {
    copy->bitmap = node->bitmap;
    copy->children = node->children;
  }
  const std::uint64_t mask = std::uint64_t{1} << bit;
  const std::size_t index = denseIndex(copy->bitmap, bit);
  if (replaced) {
    if (copy->bitmap & mask) {
      copy->children[index] = std::move(replaced);
    } else {
      copy->children.insert(copy->children.begin() + static_cast<std::ptrdiff_t>(index),
                            std::move(replaced));
      copy->bitmap |= mask;
    }
  } else if (copy->bitmap & mask) {
    copy->children.erase(copy->children.begin() + static_cast<std::ptrdiff_t>(index));
    copy->bitmap &= ~mask;
  }
  if (copy->bitmap == 0) return nullptr;
  return copy;
}

bool visitAll(const TrieNode& node, int level,
              const std::function<bool(const ServicePortState&)>& visit) {
  if (level == kLevels) {
    for (const auto& entry : node.entries) {
      if (!visit(*entry)) return false;
    }
    return true;
  }
  for (const auto& c : node.children) {
    if (!visitAll(*c, level + 1, visit)) return false;
  }
  return true;
}

void collect(const TrieNode& node, int level, std::vector<Entry>& out) {
  if (level == kLevels) {
    out.insert(out.end(), node.entries.begin(), node.entries.end());
    return;
  }
  for (const auto& c : node.children) collect(*c, level + 1, out);
}

const std::shared_ptr<const detail::SnapshotTrie>& emptyTrie() {
  static const auto empty = std::make_shared<const detail::SnapshotTrie>();
  return empty;
}

const std::shared_ptr<const NodeInfo>& emptyNode() {
  static const auto empty = std::make_shared<const NodeInfo>();
  return empty;
}

const std::shared_ptr<const std::vector<ServiceCIDRRange>>& emptyServiceCIDRs() {
  static const auto empty = std::make_shared<const std::vector<ServiceCIDRRange>>();
  return empty;
}

}  // namespace

std::size_t ServicePortKeyHash::operator()(const ServicePortKey& key) const noexcept {
  return static_cast<std::size_t>(hashKey(key));
}

std::string Endpoint::str() const {
  std::string out;
  const bool v6 = ip.find(':') != std::string::npos;
  out.reserve(ip.size() + 8);
  if (v6) out += '[';
  out += ip;
  if (v6) out += ']';
  out += ':';
  out += std::to_string(port);
  return out;
}

EndpointList::EndpointList(std::vector<Endpoint> endpoints) { *this = std::move(endpoints); }

EndpointList::EndpointList(std::initializer_list<Endpoint> endpoints)
    : EndpointList(std::vector<Endpoint>(endpoints)) {}

EndpointList& EndpointList::operator=(std::vector<Endpoint> endpoints) {
  if (endpoints.empty()) {
    items_.reset();
  } else {
    items_ = std::make_shared<std::vector<Endpoint>>(std::move(endpoints));
  }
  return *this;
}

EndpointList& EndpointList::operator=(std::initializer_list<Endpoint> endpoints) {
  return *this = std::vector<Endpoint>(endpoints);
}

const std::vector<Endpoint>& EndpointList::vector() const {
  static const std::vector<Endpoint> kEmpty;
  return items_ ? *items_ : kEmpty;
}

void EndpointList::push_back(Endpoint endpoint) { mutableVector().push_back(std::move(endpoint)); }

void EndpointList::clear() { items_.reset(); }

std::vector<Endpoint>& EndpointList::mutableVector() {
  if (!items_) {
    items_ = std::make_shared<std::vector<Endpoint>>();
  } else if (items_.use_count() > 1) {
    items_ = std::make_shared<std::vector<Endpoint>>(*items_);
  }
  return *items_;
}

bool ServicePortState::externallyAccessible() const {
  return nodePort != 0 || !loadBalancerVIPs.empty() || !externalIPs.empty();
}

bool ServicePortState::usesClusterEndpoints() const {
  // Even with externalTrafficPolicy Local, external traffic from inside the cluster is
  // short-circuited to Cluster endpoints, so any external access needs them.
  return internalPolicy != TrafficPolicy::kLocal || externallyAccessible();
}

bool ServicePortState::usesLocalEndpoints() const {
  return internalPolicy == TrafficPolicy::kLocal ||
         (externalPolicy == TrafficPolicy::kLocal && externallyAccessible());
}

Snapshot::Snapshot() : trie_(emptyTrie()), node_(emptyNode()), serviceCIDRs_(emptyServiceCIDRs()) {}
Snapshot::~Snapshot() = default;
Snapshot::Snapshot(const Snapshot&) = default;
Snapshot& Snapshot::operator=(const Snapshot&) = default;

std::size_t Snapshot::size() const { return trie_->size; }

std::shared_ptr<const ServicePortState> Snapshot::find(const ServicePortKey& key) const {
  const TrieNode* node = trie_->root.get();
  const std::uint64_t hash = hashKey(key);
  for (int level = 0; level < kLevels && node != nullptr; ++level) {
    node = child(*node, slot(hash, level));
  }
  if (node == nullptr) return nullptr;
  auto it = findInBucket(node->entries, key);
  if (it != node->entries.end() && (*it)->key == key) return *it;
  return nullptr;
}

void Snapshot::forEach(const std::function<bool(const ServicePortState&)>& visit) const {
  if (trie_->root) visitAll(*trie_->root, 0, visit);
}

std::vector<std::shared_ptr<const ServicePortState>> Snapshot::sorted() const {
  std::vector<Entry> out;
  out.reserve(trie_->size);
  if (trie_->root) collect(*trie_->root, 0, out);
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a->key < b->key; });
  return out;
}

Snapshot Snapshot::with(const ServicePortKey& key,
                        std::shared_ptr<const ServicePortState> state) const {
  assert(!state || state->key == key);
  Snapshot next(*this);
  if (!state && !find(key)) return next;  // removing an absent key changes nothing
  long delta = 0;
  auto trie = std::make_shared<detail::SnapshotTrie>();
  trie->root = update(trie_->root.get(), 0, hashKey(key), key, state, delta);
  trie->size = static_cast<std::size_t>(static_cast<long>(trie_->size) + delta);
  next.trie_ = std::move(trie);
  return next;
}

Snapshot Snapshot::withNode(NodeInfo node) const {
  Snapshot next(*this);
  next.node_ = std::make_shared<const NodeInfo>(std::move(node));
  return next;
}

Snapshot Snapshot::withServiceCIDRs(std::vector<ServiceCIDRRange> cidrs) const {
  Snapshot next(*this);
  next.serviceCIDRs_ = std::make_shared<const std::vector<ServiceCIDRRange>>(std::move(cidrs));
  return next;
}

Snapshot Snapshot::withGeneration(std::uint64_t generation) const {
  Snapshot next(*this);
  next.generation_ = generation;
  return next;
}

bool Snapshot::sharesEntry(const Snapshot& other, const ServicePortKey& key) const {
  auto mine = find(key);
  return mine != nullptr && mine == other.find(key);
}

}  // namespace kproxy::core
