#include "status_command.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "net_util.h"
#include "service_status.h"

namespace kproxy::cli {
namespace {

constexpr int kTimeoutMs = 10'000;

int usage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kproxy status: %s\n", error.c_str());
  std::fputs(
      "usage: kproxy status [--server HOST:PORT] [-o table|wide|json] [NAMESPACE/SERVICE]\n"
      "Prints what each service port means on this node and where its programming stands, from\n"
      "a running kproxy's /debug/services (its metrics server, 127.0.0.1:10249 by default).\n",
      error.empty() ? stdout : stderr);
  return error.empty() ? 0 : 2;
}

std::string percentEncode(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// One plain HTTP/1.0 GET; the body on success, an error message otherwise.
bool httpGet(const std::string& server, const std::string& target, std::string& body, std::string& error) {
  auto hp = splitHostPort(server);
  if (!hp || hp->port.empty()) {
    error = "--server " + server + ": want HOST:PORT";
    return false;
  }
  std::string host = hp->host;
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), hp->port.c_str(), &hints, &res); rc != 0) {
    error = "resolving " + host + ": " + gai_strerror(rc);
    return false;
  }
  int fd = -1;
  std::string lastError = "no address";
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      lastError = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    error = "connecting to " + server + ": " + lastError + " (is kproxy running, with its metrics server there?)";
    return false;
  }
  const std::string request = "GET " + target + " HTTP/1.0\r\nHost: " + host + "\r\nAccept: application/json\r\n\r\n";
  std::string response;
  bool ok = send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size());
  while (ok) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, kTimeoutMs) <= 0) {
      error = "no answer from " + server + " within 10 s";
      close(fd);
      return false;
    }
    char buf[65536];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0) ok = false;
    if (n <= 0) break;
    response.append(buf, static_cast<std::size_t>(n));
  }
  close(fd);
  if (!ok) {
    error = "reading from " + server + ": " + std::strerror(errno);
    return false;
  }
  const auto headerEnd = response.find("\r\n\r\n");
  const auto firstLine = response.substr(0, response.find("\r\n"));
  if (headerEnd == std::string::npos || firstLine.size() < 12) {
    error = "not an HTTP answer from " + server;
    return false;
  }
  const std::string code = firstLine.substr(9, 3);
  body = response.substr(headerEnd + 4);
  if (code != "200") {
    error = server + target + " answered " + firstLine.substr(9) +
            (code == "404" ? " (a kproxy older than /debug/services, or not kproxy)" : "");
    return false;
  }
  return true;
}

}  // namespace

int statusCommand(std::span<const char* const> args) {
  std::string server = "127.0.0.1:10249";
  std::string output = "table";
  std::string service;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    auto value = [&](std::string_view flag) -> const char* {
      if (a.starts_with(std::string(flag) + "=")) return args[i] + flag.size() + 1;
      if (a == flag && i + 1 < args.size()) return args[++i];
      return nullptr;
    };
    if (a == "-h" || a == "--help") return usage("");
    if (const char* v = value("--server")) {
      server = v;
    } else if (const char* o = value("-o"); o || (o = value("--output"))) {
      output = o;
    } else if (!a.starts_with("-") && service.empty()) {
      service = std::string(a);
    } else {
      return usage("unexpected argument " + std::string(a));
    }
  }
  if (output != "table" && output != "wide" && output != "json") return usage("-o " + output + ": want table, wide or json");
  if (!service.empty() && service.find('/') == std::string::npos) service = "default/" + service;

  std::string body, error;
  if (!httpGet(server, "/debug/services" + (service.empty() ? "" : "?service=" + percentEncode(service)), body, error)) {
    std::fprintf(stderr, "kproxy status: %s\n", error.c_str());
    return 1;
  }
  auto doc = nlohmann::json::parse(body, nullptr, false);
  if (doc.is_discarded()) {
    std::fprintf(stderr, "kproxy status: %s/debug/services did not answer JSON\n", server.c_str());
    return 1;
  }
  if (output == "json") {
    std::fputs((doc.dump(2) + "\n").c_str(), stdout);
  } else {
    std::fputs(servicesStatusTable(doc, output == "wide").c_str(), stdout);
  }
  if (!service.empty() && doc.value("services", nlohmann::json::array()).empty()) {
    std::fprintf(stderr, "kproxy status: no service %s on this node\n", service.c_str());
    return 1;
  }
  return 0;
}

}  // namespace kproxy::cli
