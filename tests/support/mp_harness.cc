#include "support/mp_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

namespace shoal::testing {
namespace {

double nowMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

bool writeAll(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

// Reads exactly len bytes within timeoutMs; false on EOF, error or timeout.
bool readAll(int fd, void* data, size_t len, int timeoutMs) {
  char* p = static_cast<char*>(data);
  double deadline = nowMs() + timeoutMs;
  while (len > 0) {
    int left = static_cast<int>(deadline - nowMs());
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    int rc = ::poll(&pfd, 1, left);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    ssize_t n = ::read(fd, p, len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

void closeFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

// ---- child side ------------------------------------------------------------

bool MpChild::uniqueId(ncclUniqueId* out) {
  if (haveId_) {
    *out = id_;
    return true;
  }
  if (rank_ == 0) {
    ncclResult_t rc = ncclGetUniqueId(&id_);
    if (rc != ncclSuccess) {
      log(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(rc) + ": " +
          ncclGetLastError(nullptr));
      return false;
    }
    for (int& fd : idWriteFds_) {
      if (!writeAll(fd, id_.internal, sizeof(id_.internal))) log("could not hand the id to a rank");
      closeFd(fd);
    }
  } else {
    if (!readAll(idReadFd_, id_.internal, sizeof(id_.internal), 30000)) {
      log("did not receive the unique id from rank 0 within 30 s");
      return false;
    }
    closeFd(idReadFd_);
  }
  haveId_ = true;
  *out = id_;
  return true;
}

bool MpChild::barrier(int timeoutMs) {
  char token = 'b';
  if (!writeAll(barrierUpFd_, &token, 1)) {
    log("barrier: the parent is gone");
    return false;
  }
  if (!readAll(barrierDownFd_, &token, 1, timeoutMs)) {
    log("barrier: not released within " + std::to_string(timeoutMs) + " ms");
    return false;
  }
  return true;
}

void MpChild::log(const std::string& line) {
  char prefix[64];
  std::snprintf(prefix, sizeof(prefix), "[rank %d +%.0f ms] ", rank_, elapsedMs());
  std::string text = prefix + line + "\n";
  if (reportFd_ >= 0) (void)writeAll(reportFd_, text.data(), text.size());
}

double MpChild::elapsedMs() const { return nowMs() - startMs_; }

// ---- parent side -----------------------------------------------------------

bool MpResult::allPassed() const {
  if (timedOut) return false;
  for (const auto& r : ranks)
    if (!r.exited || r.exitCode != 0) return false;
  return true;
}

bool MpResult::onlyVictimKilled(int victim) const {
  for (const auto& r : ranks) {
    if (r.rank == victim ? (r.exited || r.termSignal != SIGKILL) : (!r.exited || r.exitCode != 0)) return false;
  }
  return true;
}

std::string MpResult::report() const {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "%zu ranks, %.0f ms%s\n", ranks.size(), wallMs,
                timedOut ? ", WATCHDOG FIRED (hard limit reached)" : "");
  out += line;
  for (const auto& r : ranks) {
    if (r.exited)
      std::snprintf(line, sizeof(line), "rank %d (pid %d): exit code %d\n", r.rank,
                    static_cast<int>(r.pid), r.exitCode);
    else
      std::snprintf(line, sizeof(line), "rank %d (pid %d): killed by signal %d (%s)%s\n", r.rank,
                    static_cast<int>(r.pid), r.termSignal, strsignal(r.termSignal),
                    r.killedByWatchdog ? " from the watchdog" : "");
    out += line;
    out += r.log;
  }
  return out;
}

class MpRunner {
 public:
  static MpResult run(const MpConfig& cfg, const std::function<int(MpChild&)>& body);
};

MpResult MpRunner::run(const MpConfig& cfg, const std::function<int(MpChild&)>& body) {
  const int n = cfg.nranks;
  MpResult result;
  result.ranks.resize(n);
  std::vector<int> reportRead(n, -1), reportWrite(n, -1);
  std::vector<int> idRead(n, -1), idWrite(n, -1);  // [r] for r >= 1
  std::vector<int> upRead(n, -1), upWrite(n, -1), downRead(n, -1), downWrite(n, -1);
  for (int r = 0; r < n; ++r) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) std::abort();
    reportRead[r] = fds[0];
    reportWrite[r] = fds[1];
    if (::pipe2(fds, O_CLOEXEC) != 0) std::abort();
    upRead[r] = fds[0];
    upWrite[r] = fds[1];
    if (::pipe2(fds, O_CLOEXEC) != 0) std::abort();
    downRead[r] = fds[0];
    downWrite[r] = fds[1];
    if (r > 0) {
      if (::pipe2(fds, O_CLOEXEC) != 0) std::abort();
      idRead[r] = fds[0];
      idWrite[r] = fds[1];
    }
  }
  std::fflush(nullptr);  // no buffered output duplicated into children
  // A child may die between reaching the barrier and its release: writing to
  // its pipe must not kill this process.
  struct sigaction ignorePipe {}, oldPipe {};
  ignorePipe.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignorePipe, &oldPipe);
  double start = nowMs();
  std::vector<pid_t> pids(n, -1);
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) std::abort();
    if (pid == 0) {
      // Child: keep only our ends.
      MpChild child;
      child.rank_ = r;
      child.nranks_ = n;
      child.startMs_ = start;
      for (int q = 0; q < n; ++q) {
        closeFd(reportRead[q]);
        if (q != r) closeFd(reportWrite[q]);
        if (q > 0 && q != r) closeFd(idRead[q]);
        if (q > 0 && r != 0) closeFd(idWrite[q]);
        closeFd(upRead[q]);
        closeFd(downWrite[q]);
        if (q != r) {
          closeFd(upWrite[q]);
          closeFd(downRead[q]);
        }
      }
      child.barrierUpFd_ = upWrite[r];
      child.barrierDownFd_ = downRead[r];
      child.reportFd_ = reportWrite[r];
      if (r == 0)
        for (int q = 1; q < n; ++q) child.idWriteFds_.push_back(idWrite[q]);
      else
        child.idReadFd_ = idRead[r];
      ::signal(SIGPIPE, SIG_IGN);
      bool haveIf = false, haveTransport = false;
      for (const auto& [k, v] : cfg.env) {
        if (k == "NCCL_SOCKET_IFNAME") haveIf = true;
        if (k == "SHOAL_TRANSPORT") haveTransport = true;
        ::setenv(k.c_str(), v.c_str(), 1);
      }
      if (!haveIf) ::setenv("NCCL_SOCKET_IFNAME", "lo", 1);
      if (!haveTransport) ::setenv("SHOAL_TRANSPORT", "tcp", 1);
      int code = 1;
      try {
        code = body(child);
      } catch (const std::exception& e) {
        child.log(std::string("exception: ") + e.what());
        code = 3;
      } catch (...) {
        child.log("unknown exception");
        code = 3;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids[r] = pid;
    result.ranks[r].rank = r;
    result.ranks[r].pid = pid;
  }
  // Parent: only the report read ends and the barrier ends stay open.
  for (int r = 0; r < n; ++r) {
    closeFd(reportWrite[r]);
    closeFd(idRead[r]);
    closeFd(idWrite[r]);
    closeFd(upWrite[r]);
    closeFd(downRead[r]);
    ::fcntl(reportRead[r], F_SETFL, O_NONBLOCK);
    ::fcntl(upRead[r], F_SETFL, O_NONBLOCK);
  }
  std::vector<bool> atBarrier(n, false);
  // Reads barrier arrivals; releases everyone waiting once every rank that is
  // still alive waits.
  auto serveBarrier = [&](const std::vector<bool>& exited) {
    for (int r = 0; r < n; ++r) {
      char token;
      while (upRead[r] >= 0) {
        ssize_t got = ::read(upRead[r], &token, 1);
        if (got == 1) {
          atBarrier[r] = true;
          continue;
        }
        if (got == 0) closeFd(upRead[r]);
        break;
      }
    }
    bool anyWaiting = false;
    for (int r = 0; r < n; ++r) {
      if (exited[r]) continue;
      if (!atBarrier[r]) return;
      anyWaiting = true;
    }
    if (!anyWaiting) return;
    for (int r = 0; r < n; ++r) {
      if (exited[r] || !atBarrier[r]) continue;
      char token = 'r';
      (void)writeAll(downWrite[r], &token, 1);
      atBarrier[r] = false;
    }
  };
  auto drain = [&](int r) {
    char buf[4096];
    while (reportRead[r] >= 0) {
      ssize_t got = ::read(reportRead[r], buf, sizeof(buf));
      if (got > 0) {
        result.ranks[r].log.append(buf, static_cast<size_t>(got));
        continue;
      }
      if (got == 0) closeFd(reportRead[r]);  // EOF: child gone
      break;                                 // EAGAIN or error
    }
  };
  int alive = n;
  std::vector<bool> done(n, false);
  double deadline = start + cfg.hardLimitMs;
  while (alive > 0) {
    for (int r = 0; r < n; ++r) {
      drain(r);
      if (done[r]) continue;
      int status = 0;
      pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) {
        done[r] = true;
        --alive;
        if (WIFEXITED(status)) {
          result.ranks[r].exited = true;
          result.ranks[r].exitCode = WEXITSTATUS(status);
        } else if (WIFSIGNALED(status)) {
          result.ranks[r].termSignal = WTERMSIG(status);
        }
      }
    }
    if (alive == 0) break;
    serveBarrier(done);
    if (nowMs() > deadline) {
      result.timedOut = true;
      for (int r = 0; r < n; ++r) {
        if (done[r]) continue;
        ::kill(pids[r], SIGKILL);
        int status = 0;
        ::waitpid(pids[r], &status, 0);
        done[r] = true;
        result.ranks[r].killedByWatchdog = true;
        result.ranks[r].termSignal = SIGKILL;
      }
      alive = 0;
      break;
    }
    ::usleep(2000);
  }
  for (int r = 0; r < n; ++r) {
    drain(r);
    closeFd(reportRead[r]);
    closeFd(upRead[r]);
    closeFd(downWrite[r]);
  }
  result.wallMs = nowMs() - start;
  ::sigaction(SIGPIPE, &oldPipe, nullptr);
  return result;
}

MpResult runForked(const MpConfig& cfg, const std::function<int(MpChild&)>& body) {
  return MpRunner::run(cfg, body);
}

int freeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

}  // namespace shoal::testing
