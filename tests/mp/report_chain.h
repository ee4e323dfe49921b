// A chain of failure reports whose first cause comes after the failures
// it causes, for the forked-process tests over shm (tests/mp/mp_test.cc)
// and ofi (tests/mp/ofi_mp_test.cc).
#pragma once

#include <nccl.h>

#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "mp/mp_checks.h"
#include "support/mp_harness.h"

namespace shoal::testing {

// Three ranks, SHOAL_PROGRESS_TIMEOUT_MS = `timeoutMs`. Rank 1 groups a
// Recv from rank 0 with a Recv from rank 2, which stays alive without
// calling: at its deadline rank 1 fails (over shm the Recv times out, over
// ofi the connect to rank 2) and publishes a draft report, its own view.
// Rank 2 is SIGKILLed 300 ms later; rank 1 reads its will and publishes
// the final report. Rank 0, whose Send rank 1 took and whose next Recv
// from rank 1 meets rank 1's failure, must end with the final report: every
// survivor's error says that rank 2's process ended. `quotesDraft`: the
// transport quotes a closing peer's report in its error (shm), so rank 0
// fails at rank 1's close, with the draft quoted once.
inline int firstCauseAfterItsEffects(MpChild& c, int timeoutMs, bool quotesDraft) {
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  const size_t n = 16;
  std::vector<float> fromZero(n, -1.f), fromTwo(n, -1.f), mine(n, float(c.rank()));
  CHILD_CHECK(c, c.barrier(), "the ranks did not meet after init");
  if (c.rank() == 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(timeoutMs + 300));
    c.log("killing myself (SIGKILL) after rank 1's deadline");
    ::raise(SIGKILL);
  }
  ncclResult_t rc = ncclSuccess;
  if (c.rank() == 1) {
    CHILD_NCCL(c, ncclGroupStart());
    CHILD_NCCL(c, ncclRecv(fromZero.data(), n, ncclFloat, 0, comm, nullptr));
    CHILD_NCCL(c, ncclRecv(fromTwo.data(), n, ncclFloat, 2, comm, nullptr));
    rc = ncclGroupEnd();
  } else {
    CHILD_NCCL(c, ncclSend(mine.data(), n, ncclFloat, 1, comm, nullptr));
    std::this_thread::sleep_for(std::chrono::milliseconds(timeoutMs / 2));  // rank 1's deadline comes first
    rc = ncclRecv(fromZero.data(), n, ncclFloat, 1, comm, nullptr);
  }
  const std::string last = ncclGetLastError(nullptr);
  c.log(describe(rc));
  CHILD_CHECK(c, c.barrier(), "the other rank did not finish");
  CHILD_CHECK(c, rc == ncclRemoteError, "expected ncclRemoteError, got " + describe(rc));
  CHILD_CHECK(c, last.find("rank 2") != std::string::npos && last.find("its process ended") != std::string::npos,
              "the error does not say that rank 2's process ended: " + last);
  if (quotesDraft && c.rank() == 1) CHILD_CHECK(c, fromZero[0] == 0.f, "the Recv from rank 0 did not complete");
  if (quotesDraft && c.rank() == 0) {
    const size_t first = last.find("no progress for");
    CHILD_CHECK(c, last.find("closed its end") < first, "rank 0 did not fail at rank 1's close: " + last);
    CHILD_CHECK(c, first != std::string::npos && last.find("no progress for", first + 1) == std::string::npos,
                "the error does not quote rank 1's view once: " + last);
  }
  CHILD_NCCL(c, ncclCommAbort(comm));
  return 0;
}

}  // namespace shoal::testing
