// Status and Result<T>: Shoal's errors as values.
//
// Role: every fallible internal function returns Status or Result<T>; the C ABI
// layer (src/api) is the only place a Status becomes an ncclResult_t. Exceptions
// never cross a thread or the C ABI (docs/design.md, Errors).
//
// Context is added on every hop with SHOAL_TRY(expr) << "what we were doing", so
// a final message reads "allreduce ring step 3: recv from rank 5 (...): reset".
#pragma once

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace shoal {

// Mirrors ncclResult_t values 0..8; the internal codes after it map to the
// nearest NCCL code in toNcclCode() (one table, tested).
enum class Code : int {
  kOk = 0,
  kCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
  kTimeout = 8,
  // Internal only.
  kAborted = 100,      // the communicator was aborted
  kUnsupported = 101,  // a capability or function Shoal does not implement
  kAgain = 102,        // back-pressure: try again later; never reaches users
};

const char* codeName(Code code);
// The ncclResult_t value a code becomes at the C boundary.
int toNcclCode(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(Code code, std::string message)
      : code_(code),
        message_(message.empty() ? nullptr : std::make_unique<std::string>(std::move(message))) {}
  Status(const Status& other) : code_(other.code_), message_(copyMessage(other)) {}
  Status(Status&& other) noexcept = default;
  Status& operator=(const Status& other) {
    if (this != &other) {
      code_ = other.code_;
      message_ = copyMessage(other);
    }
    return *this;
  }
  Status& operator=(Status&& other) noexcept = default;

  static Status ok() { return Status(); }
  bool isOk() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const;

  // Prepends "context: " to the message (outermost context first).
  Status& withContext(std::string_view context);
  // "invalid argument: <message>" style text for logs.
  std::string toString() const;

 private:
  static std::unique_ptr<std::string> copyMessage(const Status& other) {
    return other.message_ ? std::make_unique<std::string>(*other.message_) : nullptr;
  }
  Code code_ = Code::kOk;
  // The message lives on the heap, so that the statuses every call passes
  // along its success path are a code and a null pointer (no string to build,
  // move and destroy). Null: empty message (ok, and kAgain on the data path).
  std::unique_ptr<std::string> message_;
};

// Builds a message from any streamable parts: str("rank ", r, " of ", n).
template <typename... Parts>
std::string str(Parts&&... parts) {
  if constexpr (sizeof...(Parts) == 0) {
    return {};
  } else {
    std::ostringstream out;
    (out << ... << std::forward<Parts>(parts));
    return out.str();
  }
}

// Sixteen lowercase hex digits: how ids, nonces and hashes are named in
// keys, scopes and logs.
std::string hex64(uint64_t value);

template <typename... Parts>
Status error(Code code, Parts&&... parts) {
  return Status(code, str(std::forward<Parts>(parts)...));
}
template <typename... Parts>
Status invalidArgument(Parts&&... parts) {
  return error(Code::kInvalidArgument, std::forward<Parts>(parts)...);
}
template <typename... Parts>
Status invalidUsage(Parts&&... parts) {
  return error(Code::kInvalidUsage, std::forward<Parts>(parts)...);
}
template <typename... Parts>
Status systemError(Parts&&... parts) {
  return error(Code::kSystemError, std::forward<Parts>(parts)...);
}
template <typename... Parts>
Status remoteError(Parts&&... parts) {
  return error(Code::kRemoteError, std::forward<Parts>(parts)...);
}
template <typename... Parts>
Status internalError(Parts&&... parts) {
  return error(Code::kInternalError, std::forward<Parts>(parts)...);
}
// errno-based system error: "<what>: <strerror(err)>", code chosen from errno
// (connection resets and refusals are remote errors).
Status errnoStatus(int err, std::string_view what);

// Value or error. Access to value() on an error is a bug (SHOAL_CHECK).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {}  // NOLINT

  bool isOk() const { return std::holds_alternative<T>(data_); }
  const Status& status() const;
  Status takeStatus() { return isOk() ? Status::ok() : std::move(std::get<Status>(data_)); }
  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> data_;
};

template <typename T>
const Status& Result<T>::status() const {
  static const Status kOk;
  return isOk() ? kOk : std::get<Status>(data_);
}

// Accumulates context for a failed status on its way out of a function; converts
// implicitly to Status or Result<T>.
class StatusBuilder {
 public:
  explicit StatusBuilder(Status status) : status_(std::move(status)) {}
  template <typename Part>
  StatusBuilder&& operator<<(Part&& part) && {
    context_ << std::forward<Part>(part);
    return std::move(*this);
  }
  operator Status() &&;  // NOLINT: implicit by design
  template <typename T>
  operator Result<T>() && {  // NOLINT
    return Result<T>(static_cast<Status>(std::move(*this)));
  }

 private:
  Status status_;
  std::ostringstream context_;
};

namespace detail {
inline Status toStatus(Status status) { return status; }
template <typename T>
Status toStatus(const Result<T>& result) {
  return result.status();
}
}  // namespace detail

[[noreturn]] void checkFailed(const char* file, int line, const char* expr, const std::string& msg);

}  // namespace shoal

#define SHOAL_CONCAT_INNER(a, b) a##b
#define SHOAL_CONCAT(a, b) SHOAL_CONCAT_INNER(a, b)

// Returns early with the failed status; stream extra context after it:
//   SHOAL_TRY(conn.poll()) << "ring step " << step;
#define SHOAL_TRY(expr)                                                                  \
  switch (0)                                                                             \
  case 0:                                                                                \
  default:                                                                               \
    if (::shoal::Status SHOAL_CONCAT(shoal_status_, __LINE__) = ::shoal::detail::toStatus(expr); \
      SHOAL_CONCAT(shoal_status_, __LINE__).isOk()) {                                    \
  } else                                                                                 \
    return ::shoal::StatusBuilder(std::move(SHOAL_CONCAT(shoal_status_, __LINE__)))

// Declares or assigns `lhs` from a Result<T> expression, or returns its error
// with the optional context parts prepended:
//   SHOAL_ASSIGN_OR_RETURN(auto conn, connect(peer), "connecting to rank ", peer);
#define SHOAL_ASSIGN_OR_RETURN(lhs, expr, ...)                                       \
  auto SHOAL_CONCAT(shoal_result_, __LINE__) = (expr);                               \
  if (!SHOAL_CONCAT(shoal_result_, __LINE__).isOk())                                 \
    return ::shoal::StatusBuilder(SHOAL_CONCAT(shoal_result_, __LINE__).takeStatus()) \
           << ::shoal::str(__VA_ARGS__);                                             \
  lhs = std::move(SHOAL_CONCAT(shoal_result_, __LINE__)).value()

// Bugs are not errors: abort with a message.
#define SHOAL_CHECK(cond, ...)                                                         \
  do {                                                                                 \
    if (!(cond)) ::shoal::checkFailed(__FILE__, __LINE__, #cond, ::shoal::str("" __VA_ARGS__)); \
  } while (0)
