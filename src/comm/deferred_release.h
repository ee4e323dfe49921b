// DeferredRelease: memory of a communicator's teardown that a CUDA stream
// may still use, freed once the stream has passed it, off the caller's
// thread.
//
// Role: ncclCommDestroy and ncclCommAbort return without waiting for the
// user's streams. A stream held back by work of the user's ahead of an
// operation (another communicator's call that hangs, a long kernel) may
// still copy out of the staging or write its words; a watchdog that aborts
// several communicators one after the other must not wait for each (up to
// the no-progress deadline). What such a stream may touch is handed here:
// `passed` is asked every few milliseconds, and once it says so `free` runs;
// what is not passed within the deadline is left allocated (said at WARN),
// never freed under a stream.
// Thread: one background thread while anything waits here (it ends once
// nothing does); release() from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace shoal::deferred {

void release(std::string what, std::function<bool()> passed, std::function<void()> free, int64_t deadlineMs);

// How many releases still wait (tests).
size_t waiting();

}  // namespace shoal::deferred
