#include "core/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace shoal {

const char* codeName(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kCudaError: return "cuda error";
    case Code::kSystemError: return "system error";
    case Code::kInternalError: return "internal error";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kInvalidUsage: return "invalid usage";
    case Code::kRemoteError: return "remote error";
    case Code::kInProgress: return "in progress";
    case Code::kTimeout: return "timeout";
    case Code::kAborted: return "aborted";
    case Code::kUnsupported: return "unsupported";
    case Code::kAgain: return "again";
  }
  return "unknown";
}

int toNcclCode(Code code) {
  switch (code) {
    case Code::kOk: return 0;
    case Code::kCudaError: return 1;
    case Code::kSystemError: return 2;
    case Code::kInternalError: return 3;
    case Code::kInvalidArgument: return 4;
    case Code::kInvalidUsage: return 5;
    case Code::kRemoteError: return 6;
    case Code::kInProgress: return 7;
    // A deadline that expired is, to a caller, a peer that stopped answering:
    // ncclRemoteError is known to every caller (NCCL 2.13+; ncclTimeout only
    // to headers from 2.30.3).
    case Code::kTimeout: return 6;
    case Code::kAborted: return 5;        // using an aborted communicator
    case Code::kUnsupported: return 5;    // ncclInvalidUsage: not implemented
    case Code::kAgain: return 3;          // must never escape: internal error
  }
  return 3;
}

const std::string& Status::message() const {
  // Never destroyed: detached threads (the engine's progress thread) may read
  // a status while the process exits.
  static const std::string* const kEmpty = new std::string();
  return message_ ? *message_ : *kEmpty;
}

Status& Status::withContext(std::string_view context) {
  if (context.empty()) return *this;
  std::string joined = std::string(context) + ": " + message();
  message_ = std::make_unique<std::string>(std::move(joined));
  return *this;
}

std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string Status::toString() const {
  if (isOk()) return "ok";
  return std::string(codeName(code_)) + ": " + message();
}

Status errnoStatus(int err, std::string_view what) {
  Code code = Code::kSystemError;
  switch (err) {
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case ENOTCONN:
    case EHOSTDOWN:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EPIPE:
    case ETIMEDOUT:
      code = Code::kRemoteError;
      break;
    default:
      break;
  }
  return Status(code, str(what, ": ", std::strerror(err)));
}

StatusBuilder::operator Status() && {
  status_.withContext(context_.str());
  return std::move(status_);
}

void checkFailed(const char* file, int line, const char* expr, const std::string& msg) {
  std::fprintf(stderr, "shoal: internal check failed at %s:%d: %s %s\n", file, line, expr,
               msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace shoal
