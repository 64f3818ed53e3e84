#include "kproxy/backends/common/chain_names.h"

#include <openssl/sha.h>

#include <algorithm>
#include <array>

#include "kproxy/net/host_port.h"

namespace kproxy::backends {
namespace {

// Upstream's limit for the hashed part of an nftables chain name; kube names never reach it.
constexpr std::size_t kNftablesChainNameBaseLengthMax = 240;
// Upstream keeps 16 characters: iptables chain names must stay under 29 characters.
constexpr std::size_t kIptablesHashLength = 16;

std::string prefixed(std::string_view prefix, std::string hash) {
  std::string out(prefix);
  out += hash;
  return out;
}

}  // namespace

std::string base32Sha256Prefix(std::string_view input, std::size_t length) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
  std::array<unsigned char, SHA256_DIGEST_LENGTH> digest{};
  SHA256(reinterpret_cast<const unsigned char*>(input.data()), input.size(), digest.data());
  // 32 bytes are 256 bits: 51 full characters and a 52nd from the last bit, zero padded.
  length = std::min<std::size_t>(length, (digest.size() * 8 + 4) / 5);
  std::string out;
  out.reserve(length);
  for (std::size_t c = 0; c < length; ++c) {
    unsigned value = 0;
    for (std::size_t b = c * 5; b < c * 5 + 5; ++b) {
      unsigned bit = 0;
      if (b < digest.size() * 8) bit = (digest[b / 8] >> (7 - b % 8)) & 1u;
      value = (value << 1) | bit;
    }
    out.push_back(kAlphabet[value]);
  }
  return out;
}

std::string nftablesHashAndTruncate(std::string_view name) {
  std::string out = base32Sha256Prefix(name, 8);
  out += '-';
  out += name;
  if (out.size() > kNftablesChainNameBaseLengthMax) {
    out.resize(kNftablesChainNameBaseLengthMax - 3);
    out += "...";
  }
  return out;
}

std::string servicePortNameString(std::string_view ns, std::string_view name, std::string_view portName) {
  std::string out(ns);
  out += '/';
  out += name;
  if (!portName.empty()) {
    out += ':';
    out += portName;
  }
  return out;
}

std::string endpointHostPort(std::string_view ip, int port) {
  return net::joinHostPort(ip, std::to_string(port));
}

std::string portProtoHash(std::string_view servicePortName, std::string_view protocol) {
  std::string input(servicePortName);
  input += protocol;
  return base32Sha256Prefix(input, kIptablesHashLength);
}

std::string servicePortPolicyClusterChain(std::string_view servicePortName, std::string_view protocol) {
  return prefixed(iptables_chains::kClusterPolicyPrefix, portProtoHash(servicePortName, protocol));
}

std::string servicePortPolicyLocalChain(std::string_view servicePortName, std::string_view protocol) {
  return prefixed(iptables_chains::kLocalPolicyPrefix, portProtoHash(servicePortName, protocol));
}

std::string serviceExternalChain(std::string_view servicePortName, std::string_view protocol) {
  return prefixed(iptables_chains::kExternalPrefix, portProtoHash(servicePortName, protocol));
}

std::string serviceFirewallChain(std::string_view servicePortName, std::string_view protocol) {
  return prefixed(iptables_chains::kFirewallPrefix, portProtoHash(servicePortName, protocol));
}

std::string servicePortEndpointChain(std::string_view servicePortName, std::string_view protocol,
                                     std::string_view endpoint) {
  std::string input(servicePortName);
  input += protocol;
  input += endpoint;
  return prefixed(iptables_chains::kEndpointPrefix, base32Sha256Prefix(input, kIptablesHashLength));
}

bool isServiceChainName(std::string_view chain) {
  using namespace iptables_chains;
  for (auto prefix : {kClusterPolicyPrefix, kLocalPolicyPrefix, kEndpointPrefix, kFirewallPrefix, kExternalPrefix}) {
    if (chain.starts_with(prefix)) return true;
  }
  return false;
}

}  // namespace kproxy::backends
