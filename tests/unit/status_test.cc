#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "core/process.h"
#include "core/ranges.h"
#include "core/status.h"
#include "core/tag.h"

using namespace shoal;

namespace {
Status failing() { return remoteError("connection reset"); }
Status middle(int step) {
  SHOAL_TRY(failing()) << "recv from rank 5 (host b)";
  return Status::ok();
}
Status outer() {
  SHOAL_TRY(middle(3)) << "allreduce ring step " << 3;
  return Status::ok();
}
Result<int> parsePositive(int v) {
  if (v <= 0) return invalidArgument("not positive: ", v);
  return v;
}
Result<int> doubled(int v) {
  SHOAL_ASSIGN_OR_RETURN(int x, parsePositive(v), "doubling ", v);
  return 2 * x;
}
}  // namespace

TEST_CASE("context accumulates outermost first", "[unit]") {
  Status s = outer();
  REQUIRE(s.code() == Code::kRemoteError);
  REQUIRE(s.message() == "allreduce ring step 3: recv from rank 5 (host b): connection reset");
}

TEST_CASE("statuses copy their messages and carry none when empty", "[unit]") {
  Status original(Code::kRemoteError, "rank 3 closed");
  Status copy = original;
  copy.withContext("AllReduce");
  CHECK(original.message() == "rank 3 closed");
  CHECK(copy.message() == "AllReduce: rank 3 closed");
  copy = original;
  CHECK(copy.message() == "rank 3 closed");
  CHECK(copy.code() == Code::kRemoteError);
  Status moved = std::move(copy);
  CHECK(moved.message() == "rank 3 closed");

  // Back-pressure and ok carry a code and no text.
  Status again(Code::kAgain, "");
  CHECK(!again.isOk());
  CHECK(again.message().empty());
  CHECK(Status::ok().message().empty());
  again.withContext("send step 2");
  CHECK(again.message() == "send step 2: ");
  CHECK(Status::ok().toString() == "ok");
}

TEST_CASE("Result carries a value or an error with context", "[unit]") {
  auto ok = doubled(4);
  REQUIRE(ok.isOk());
  REQUIRE(ok.value() == 8);
  auto bad = doubled(-1);
  REQUIRE_FALSE(bad.isOk());
  REQUIRE(bad.status().code() == Code::kInvalidArgument);
  REQUIRE(bad.status().message() == "doubling -1: not positive: -1");
}

TEST_CASE("every code maps to one NCCL result", "[unit]") {
  REQUIRE(toNcclCode(Code::kOk) == 0);
  REQUIRE(toNcclCode(Code::kSystemError) == 2);
  REQUIRE(toNcclCode(Code::kInvalidArgument) == 4);
  REQUIRE(toNcclCode(Code::kInvalidUsage) == 5);
  REQUIRE(toNcclCode(Code::kRemoteError) == 6);
  REQUIRE(toNcclCode(Code::kInProgress) == 7);
  REQUIRE(toNcclCode(Code::kTimeout) == 6);      // a deadline: the peer stopped answering
  REQUIRE(toNcclCode(Code::kAborted) == 5);
  REQUIRE(toNcclCode(Code::kUnsupported) == 5);
  REQUIRE(toNcclCode(Code::kAgain) == 3);        // must never escape
}

TEST_CASE("errno statuses classify peer failures as remote", "[unit]") {
  REQUIRE(errnoStatus(ECONNRESET, "read").code() == Code::kRemoteError);
  REQUIRE(errnoStatus(EPIPE, "write").code() == Code::kRemoteError);
  REQUIRE(errnoStatus(EMFILE, "socket").code() == Code::kSystemError);
  REQUIRE(errnoStatus(ECONNRESET, "read").message().find("read: ") == 0);
}

TEST_CASE("message tags round-trip and describe the operation", "[unit]") {
  uint64_t tag = encodeTag(CollKind::kAllGather, DataType::kBfloat16, 1000, 0, -1, 42);
  TagFields f = decodeTag(tag);
  REQUIRE(f.kind == CollKind::kAllGather);
  REQUIRE(f.dtype == DataType::kBfloat16);
  REQUIRE(f.seq == 42);
  REQUIRE(describeTag(tag).find("AllGather #42 (bfloat16") == 0);
  // A send and its matching receive carry equal tags.
  REQUIRE(encodeTag(CollKind::kSend, DataType::kFloat32, 7, 0, -1, 3) ==
          encodeTag(CollKind::kRecv, DataType::kFloat32, 7, 0, -1, 3));
  // Different counts or collectives differ.
  REQUIRE(encodeTag(CollKind::kAllReduce, DataType::kFloat32, 8, 0, -1, 3) !=
          encodeTag(CollKind::kAllGather, DataType::kFloat32, 8, 0, -1, 3));
}

TEST_CASE("currentPid is getpid, also in a forked child", "[unit]") {
  REQUIRE(currentPid() == static_cast<int>(getpid()));
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(currentPid() == static_cast<int>(getpid()) ? 0 : 1);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(currentPid() == static_cast<int>(getpid()));
}

TEST_CASE("a range lies inside another only whole, and never by wrapping past the top", "[unit]") {
  using shoal::rangeInside;
  CHECK(rangeInside(100, 50, 100, 50));
  CHECK(rangeInside(120, 0, 100, 50));
  CHECK(rangeInside(150, 0, 100, 50));  // the empty range at the end
  CHECK_FALSE(rangeInside(99, 1, 100, 50));
  CHECK_FALSE(rangeInside(120, 31, 100, 50));
  CHECK_FALSE(rangeInside(151, 0, 100, 50));
  // address + bytes wraps to a small number: not inside.
  CHECK_FALSE(rangeInside(120, ~0ull - 100, 100, 50));
  CHECK_FALSE(rangeInside(~0ull - 10, 20, ~0ull - 50, 40));
  CHECK(rangeInside(~0ull - 10, 10, ~0ull - 50, 50));
}
