// soak_bench: the soak driver for hours (README.md, "Running for hours").
//
//   soak_bench --seconds N [--report-every S] [--setting threads|shm|tcp|ofi|all]
//              [--ranks R] [--modes a,b,...] [--rss-slack-mib M] [--heap-slack-mib H]
//
// Every rank loops over the modes (soak.h), each pass with its own warm-up,
// baseline and checks (bench counts: 100 + 2000 operations, 20 + 50 for the
// churn modes), until N seconds have passed. The first pass over all modes is
// the warm-up of the process; its resources, taken between modes when no
// communicator of a mode exists, are the process baseline. Every S seconds
// (at the next mode boundary) each measuring rank prints one line: elapsed
// time, completed passes, operations, threads, fds, own /dev/shm entries, RSS and heap
// against the baseline. Exit status: 0 if nothing failed and nothing grew
// beyond the slack; 1 on a library error or wrong data; 2 if a resource grew.
//
// --setting all runs the threads, shm and tcp settings at once, each in a
// child process forked before anything calls the library; ofi (libfabric,
// its default provider unless FI_PROVIDER says) runs only when named.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "soak/soak.h"

using namespace shoal::soak;

namespace {

struct Options {
  double seconds = 60;
  double reportEvery = 10;
  std::string setting = "all";
  int ranks = 2;
  std::vector<Mode> modes{std::begin(kAllModes), std::end(kAllModes)};
  Slack slack;
};

void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s --seconds N [--report-every S] [--setting threads|shm|tcp|ofi|all] [--ranks R]\n"
               "          [--modes blocking,nonblocking,hoststream,grouped,split,initdestroy,abort]\n"
               "          [--rss-slack-mib M] [--heap-slack-mib H]\n",
               argv0);
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "-h" || a == "--help") return false;
    if (a == "--seconds" && (v = next()))
      o->seconds = std::atof(v);
    else if (a == "--report-every" && (v = next()))
      o->reportEvery = std::atof(v);
    else if (a == "--setting" && (v = next()))
      o->setting = v;
    else if (a == "--ranks" && (v = next()))
      o->ranks = std::atoi(v);
    else if (a == "--rss-slack-mib" && (v = next()))
      o->slack.rssKiB = std::atol(v) * 1024;
    else if (a == "--heap-slack-mib" && (v = next()))
      o->slack.heapKiB = std::atol(v) * 1024;
    else if (a == "--modes" && (v = next())) {
      o->modes.clear();
      std::string list = v;
      size_t at = 0;
      while (at <= list.size()) {
        size_t end = list.find(',', at);
        if (end == std::string::npos) end = list.size();
        Mode m;
        if (!parseMode(list.substr(at, end - at), &m)) {
          std::fprintf(stderr, "unknown mode '%s'\n", list.substr(at, end - at).c_str());
          return false;
        }
        o->modes.push_back(m);
        at = end + 1;
      }
    } else {
      std::fprintf(stderr, "bad argument '%s'\n", a.c_str());
      return false;
    }
  }
  if (o->seconds <= 0 || o->reportEvery <= 0 || o->ranks < 2 || o->ranks > 16 || o->modes.empty()) return false;
  return o->setting == "threads" || o->setting == "shm" || o->setting == "tcp" || o->setting == "ofi" ||
         o->setting == "all";
}

ModeCounts benchCounts(Mode m) {
  switch (m) {
    case Mode::kSplit:
    case Mode::kInitDestroy:
    case Mode::kAbort: return {20, 50};
    default: return {100, 2000};
  }
}

double monoSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// One rank's loop. Returns 0, 1 (error) or 2 (a resource grew).
int benchRank(RankLink& link, const Options& o, double start) {
  int code = 0;
  long ops = 0, passes = 0;
  Resources baseline;
  bool haveBaseline = false;
  double lastReport = start;
  char line[512];
  auto sampleAtBoundary = [&]() {
    // Every rank idle between modes (the threads of the threads setting too).
    Resources r;
    if (!link.barrier()) return r;
    if (link.measures()) r = haveBaseline ? settleTo(baseline) : sampleResources();
    (void)link.barrier();
    return r;
  };
  for (;; ++passes) {
    for (Mode m : o.modes) {
      ModeResult res = runMode(m, link, benchCounts(m), o.slack, /*verbose=*/false);
      if (!res.error.empty()) return 1;
      if (!res.leak.empty() || !res.heapLeak.empty()) code = 2;  // runMode printed the figures
      ops += res.ops;
      const double now = monoSeconds();
      // The first pass is the process's warm-up; its end is the baseline.
      if (!haveBaseline && passes == 0 && m == o.modes.back()) {
        baseline = sampleAtBoundary();
        haveBaseline = true;
        if (link.measures()) link.print("bench baseline after the warm-up pass: " + formatResources(baseline));
        lastReport = now;
        continue;
      }
      if (!haveBaseline) continue;
      if (link.any(now - lastReport >= o.reportEvery)) {
        lastReport = now;
        Resources r = sampleAtBoundary();
        if (link.measures()) {
          std::string grew = compareResources(baseline, r, o.slack, /*checkHeap=*/true);
          std::snprintf(line, sizeof(line),
                        "t=%.0fs passes=%ld ops=%ld threads %d (%+d) fds %d (%+d) shm %d (%+d) rss %ld KiB (%+ld) "
                        "heap %ld KiB (%+ld)%s%s",
                        now - start, passes, ops, r.threads, r.threads - baseline.threads, r.fds,
                        r.fds - baseline.fds, r.shmOwn, r.shmOwn - baseline.shmOwn, r.rssKiB,
                        r.rssKiB - baseline.rssKiB, r.heapKiB, r.heapKiB - baseline.heapKiB,
                        grew.empty() ? "" : " GREW: ", grew.c_str());
          link.print(line);
          if (!grew.empty()) code = 2;
        }
      }
      if (link.any(now - start >= o.seconds)) {
        Resources r = sampleAtBoundary();
        if (link.measures()) {
          std::string grew = compareResources(baseline, r, o.slack, /*checkHeap=*/true);
          if (!grew.empty()) code = 2;
          std::snprintf(line, sizeof(line),
                        "DONE t=%.0fs passes=%ld ops=%ld final %s; against the baseline: %s -> %s", now - start,
                        passes, ops, formatResources(r).c_str(), grew.empty() ? "within slack" : grew.c_str(),
                        code == 0 ? "PASS" : "FAIL");
          link.print(line);
        }
        return code;
      }
    }
  }
}

int runSetting(const Options& o, const std::string& setting) {
  const double start = monoSeconds();
  auto body = [&](RankLink& link) { return benchRank(link, o, start); };
  if (setting == "threads") {
    std::vector<int> codes = runThreadRanks(o.ranks, body);
    int worst = 0;
    for (int c : codes) worst = std::max(worst, c);
    std::printf("[soak-bench threads] exit %d\n", worst);
    return worst;
  }
  std::string report;
  const int hardLimitMs = static_cast<int>(std::min(2.0e9, (o.seconds + 600) * 1000));
  bool ok = runForkedRanks(o.ranks, setting, hardLimitMs, body, &report);
  if (!ok) std::printf("[soak-bench %s] ranks:\n%s", setting.c_str(), report.c_str());
  std::printf("[soak-bench %s] %s\n", setting.c_str(), ok ? "exit 0" : "FAILED");
  std::fflush(stdout);
  if (ok) return 0;
  // A rank's exit code: 1 beats 2.
  return report.find("exit code 1") != std::string::npos || report.find("signal") != std::string::npos ? 1 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) {
    usage(argv[0]);
    return 64;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string modes;
  for (Mode m : o.modes) modes += std::string(modes.empty() ? "" : ",") + modeName(m);
  std::printf(
      "soak_bench: %.0f s, report every %.0f s, setting %s, %d ranks, modes %s, slack rss %ld KiB heap %ld KiB\n",
      o.seconds, o.reportEvery, o.setting.c_str(), o.ranks, modes.c_str(), o.slack.rssKiB, o.slack.heapKiB);
  if (o.setting != "all") return runSetting(o, o.setting);
  // Three settings at once, each in its own child (none has called the library).
  std::fflush(stdout);
  const char* settings[] = {"threads", "shm", "tcp"};
  std::vector<pid_t> pids;
  for (const char* s : settings) {
    pid_t pid = ::fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      int c = runSetting(o, s);
      std::fflush(nullptr);
      ::_exit(c);
    }
    pids.push_back(pid);
  }
  int worst = 0;
  for (size_t k = 0; k < pids.size(); ++k) {
    int status = 0;
    ::waitpid(pids[k], &status, 0);
    int c = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    std::printf("soak_bench: %s exited %d\n", settings[k], c);
    worst = std::max(worst, c);
  }
  std::printf("soak_bench: %s\n", worst == 0 ? "PASS" : "FAIL");
  return worst;
}
