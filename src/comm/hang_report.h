// Hang reports (docs/diagnostics.md): what each rank of a communicator is
// doing, written when an operation fails its no-progress deadline, when the
// process receives SHOAL_REPORT_SIGNAL, and from shoalCommDumpState. One
// report is one JSON object; tools/shoal_hang_report.py merges every rank's
// and names the ranks the others wait for.
//
// Role: keeps the process's live communicators (for the signal's report of
// every one), formats a report, and writes it to SHOAL_REPORT_DIR (one file
// per report) or, without a directory, to the log at WARN.
// Thread: any. The signal's reports are written by a thread that exists only
// while SHOAL_REPORT_SIGNAL is set (a signal handler can do almost nothing
// itself: it only wakes that thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace shoal {

class Communicator;
struct JobReport;

namespace hang {

// A communicator is tracked from the end of its init until its destruction.
// Starts the deadline observer and, if asked for, the signal's reporter.
void track(Communicator* comm);
void untrack(Communicator* comm);

// Writes one report (a JSON object) where SHOAL_REPORT_DIR says; `stem`
// names its file. Returns where it went ("" when written to the log).
std::string publish(const std::string& json, std::string_view stem);

// `text` as a JSON string literal (quotes included).
std::string jsonString(std::string_view text);

// What one rank's report says besides the job in flight.
struct ReportFacts {
  std::string_view reason;  // "deadline", "signal", "request"
  std::string commId;       // 16 hex digits
  int rank = 0;
  int nranks = 0;
  std::string host;
  long pid = 0;
  int64_t unixMs = 0;
  uint64_t collectivesIssued = 0;
  size_t jobsQueued = 0;
  std::string error;  // the communicator's async error; "" when none
};
// One report as a JSON object (docs/diagnostics.md names its fields);
// `inFlight` null: nothing running.
std::string formatReport(const ReportFacts& facts, const JobReport* inFlight);
// Milliseconds since the Unix epoch (reports of different hosts compare).
int64_t unixTimeMs();

}  // namespace hang
}  // namespace shoal
