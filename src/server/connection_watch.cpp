#include "server/connection_watch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>

namespace flashseek::server {

namespace {

// "addr", port of a socket address (IPv4 or IPv6); false for other families.
bool describe(const sockaddr_storage& ss, std::string& addr, int& port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  addr = buf;
  return true;
}

bool matches(int fd, const std::string& local_addr, int local_port,
             const std::string& remote_addr, int remote_port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  std::string addr;
  int port = -1;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  if (!describe(ss, addr, port) || port != remote_port || addr != remote_addr) return false;
  len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  return describe(ss, addr, port) && port == local_port && addr == local_addr;
}

}  // namespace

ConnectionWatch::ConnectionWatch(const std::string& local_addr, int local_port,
                                 const std::string& remote_addr, int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    struct stat st {};
    if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (matches(int(fd), local_addr, local_port, remote_addr, remote_port)) {
      fd_ = int(fd);
      break;
    }
  }
  closedir(dir);
}

bool ConnectionWatch::gone() const {
  if (fd_ < 0) return false;
  pollfd p{};
  p.fd = fd_;
  p.events = POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace flashseek::server
