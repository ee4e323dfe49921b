#include "comm/hang_report.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "core/log.h"
#include "core/params.h"
#include "engine/engine.h"

namespace shoal::hang {
namespace {

std::mutex& registryMutex() {
  static std::mutex* m = new std::mutex();  // lives for the process, like the engine
  return *m;
}
std::vector<Communicator*>& registry() {
  static auto* comms = new std::vector<Communicator*>();
  return *comms;
}

// On the job's thread, before the job fails: the report of its communicator.
void onDeadline(const JobReport& job) {
  std::lock_guard<std::mutex> lock(registryMutex());
  for (Communicator* comm : registry())
    if (reinterpret_cast<uintptr_t>(comm) == job.queueId) comm->publishReport("deadline", &job);
}

// SHOAL_REPORT_SIGNAL: "USR1", "SIGUSR1" or a number; 0 when unset or unknown.
int reportSignal() {
  const std::string& text = params().reportSignal;
  if (text.empty()) return 0;
  std::string name = text.rfind("SIG", 0) == 0 ? text.substr(3) : text;
  if (name == "USR1") return SIGUSR1;
  if (name == "USR2") return SIGUSR2;
  if (!name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    int n = std::atoi(name.c_str());
    if (n > 0 && n < NSIG && n != SIGKILL && n != SIGSTOP) return n;
  }
  SHOAL_WARN("SHOAL_REPORT_SIGNAL=", text, " is not a signal Shoal can catch (USR1, USR2 or a number): ignored");
  return 0;
}

std::atomic<int> gWakeFd{-1};

void onSignal(int) {
  int saved = errno;
  int fd = gWakeFd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    char byte = 1;
    ssize_t ignored = ::write(fd, &byte, 1);  // async-signal-safe; a full pipe already wakes
    (void)ignored;
  }
  errno = saved;
}

// Every tracked communicator's report, each time the signal arrives.
void reporterMain(int readFd) {
  char bytes[64];
  for (;;) {
    ssize_t n = ::read(readFd, bytes, sizeof(bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    std::lock_guard<std::mutex> lock(registryMutex());
    for (Communicator* comm : registry()) comm->publishReport("signal", nullptr);
  }
}

void startOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    Engine::instance().setTimeoutObserver(&onDeadline);
    int sig = reportSignal();
    if (sig == 0) return;
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      SHOAL_WARN("SHOAL_REPORT_SIGNAL: pipe2 failed (", std::strerror(errno), "): no signal reports");
      return;
    }
    ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
    gWakeFd.store(fds[1]);
    std::thread(reporterMain, fds[0]).detach();  // lives for the process
    struct sigaction action = {};
    action.sa_handler = onSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(sig, &action, nullptr);
    SHOAL_INFO(subsys::kInit, "hang reports on signal ", sig, " (SHOAL_REPORT_SIGNAL=", params().reportSignal, ")");
  });
}

}  // namespace

void track(Communicator* comm) {
  startOnce();
  std::lock_guard<std::mutex> lock(registryMutex());
  registry().push_back(comm);
}

void untrack(Communicator* comm) {
  std::lock_guard<std::mutex> lock(registryMutex());
  std::erase(registry(), comm);
}

std::string publish(const std::string& json, std::string_view stem) {
  const std::string& dir = params().reportDir;
  if (dir.empty()) {
    SHOAL_WARN("hang report: ", json);
    return {};
  }
  static std::atomic<uint64_t> counter{0};
  std::string path = str(dir, "/shoal-report-", stem, "-", counter.fetch_add(1), ".json");
  std::FILE* f = std::fopen(path.c_str(), "we");
  if (!f) {
    SHOAL_WARN("hang report: cannot write ", path, " (", std::strerror(errno), "): ", json);
    return {};
  }
  std::fputs(json.c_str(), f);
  std::fputc('\n', f);
  std::fclose(f);
  SHOAL_WARN("hang report written to ", path);
  return path;
}

std::string jsonString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

int64_t unixTimeMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::string formatReport(const ReportFacts& f, const JobReport* known) {
  std::string out = str("{\"shoal_report\": 1, \"reason\": ", jsonString(f.reason), ", \"comm\": \"", f.commId,
                        "\", \"rank\": ", f.rank, ", \"nranks\": ", f.nranks, ", \"host\": ", jsonString(f.host),
                        ", \"pid\": ", f.pid, ", \"unix_ms\": ", f.unixMs,
                        ", \"collectives_issued\": ", f.collectivesIssued, ", \"jobs_queued\": ", f.jobsQueued,
                        ", \"error\": ", f.error.empty() ? std::string("null") : jsonString(f.error),
                        ", \"in_flight\": ");
  if (!known) return out + "null}";
  out += str("{\"what\": ", jsonString(known->what), ", \"sequence\": ", known->sequence,
             ", \"steps_done\": ", known->stepsDone, ", \"steps_total\": ", known->stepsTotal,
             ", \"idle_ms\": ", known->idleMs, ", \"waiting_on\": [");
  for (size_t i = 0; i < known->waitingOn.size(); ++i) out += str(i ? ", " : "", known->waitingOn[i]);
  out += "], \"peers\": [";
  for (size_t i = 0; i < known->peers.size(); ++i) {
    const JobReport::Peer& p = known->peers[i];
    out += str(i ? ", " : "", "{\"rank\": ", p.rank, ", \"send_posted\": ", p.sendPosted, ", \"send_done\": ",
               p.sendDone, ", \"recv_posted\": ", p.recvPosted, ", \"recv_done\": ", p.recvDone, "}");
  }
  return out + "]}}";
}

}  // namespace shoal::hang
