#include "comm/window_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <span>
#include <mutex>

#include "collectives/plan.h"
#include "core/tag.h"

namespace shoal {

// A board's memory in this process: a memfd mapping registered for the GPU.
// This rank's own boards are listed by address, so that a rank of the same
// process holds the same memory (not a copy of the address that the owner
// may unmap first).
class BoardMemory {
 public:
  static Result<std::shared_ptr<BoardMemory>> create(cuda::Driver& driver, size_t bytes) {
    net::Fd fd(::memfd_create("shoal-window-board", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) return systemError("memfd_create of a window board: ", std::strerror(errno));
    // Sealed at its size: no peer holding it can shrink it under a mapping
    // (the next access would be SIGBUS).
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
        ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
      return systemError("sizing and sealing a window board: ", std::strerror(errno));
    SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<BoardMemory> board, map(driver, std::move(fd), bytes));
    std::lock_guard<std::mutex> lock(registryMutex());
    registry()[board->address()] = board;
    return board;
  }
  static Result<std::shared_ptr<BoardMemory>> map(cuda::Driver& driver, net::Fd fd, size_t bytes) {
    struct stat st {};
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    if (::fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes || seals < 0 ||
        (seals & F_SEAL_SHRINK) == 0)
      return invalidUsage("a window board of ", st.st_size, " bytes (seals ", seals, ") where ", bytes,
                          " bytes sealed against shrinking are needed");
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return systemError("mapping a window board: ", std::strerror(errno));
    auto board = std::shared_ptr<BoardMemory>(new BoardMemory(driver, std::move(fd), p, bytes));
    SHOAL_TRY(driver.registerHost(p, bytes)) << "registering a window board for the GPU";
    board->registered_ = true;
    return board;
  }
  // An own board of this process at `address`, if one lives.
  static std::shared_ptr<BoardMemory> find(uint64_t address) {
    std::lock_guard<std::mutex> lock(registryMutex());
    auto it = registry().find(address);
    return it == registry().end() ? nullptr : it->second.lock();
  }
  ~BoardMemory() {
    {
      std::lock_guard<std::mutex> lock(registryMutex());
      auto it = registry().find(address());
      if (it != registry().end() && it->second.expired()) registry().erase(it);
    }
    if (registered_) driver_.unregisterHost(words_);
    ::munmap(words_, bytes_);
  }
  uint64_t* words() const { return words_; }
  uint64_t address() const { return reinterpret_cast<uint64_t>(words_); }
  int descriptor() const { return fd_.get(); }

 private:
  BoardMemory(cuda::Driver& driver, net::Fd fd, void* p, size_t bytes)
      : driver_(driver), fd_(std::move(fd)), words_(static_cast<uint64_t*>(p)), bytes_(bytes) {}
  static std::mutex& registryMutex() {
    static std::mutex m;
    return m;
  }
  static std::map<uint64_t, std::weak_ptr<BoardMemory>>& registry() {
    static auto* r = new std::map<uint64_t, std::weak_ptr<BoardMemory>>;
    return *r;
  }

  cuda::Driver& driver_;
  net::Fd fd_;
  uint64_t* words_;
  size_t bytes_;
  bool registered_ = false;
};

namespace board {

uint64_t bytes(int nranks) {
  const uint64_t words = slot(nranks) + static_cast<uint64_t>(nranks);
  return (words * 8 + 4095) / 4096 * 4096;
}

uint64_t hash(uint64_t tag, const WindowCall& call, uint64_t sequence) {
  // splitmix64's finalizer over each field in turn.
  auto mix = [](uint64_t h, uint64_t v) {
    uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(0x5348'4f41'4c00'0000ull, tag);
  for (uint64_t v : {call.count, call.sendRegistration, call.recvRegistration, call.sendOffset, call.recvOffset, sequence})
    h = mix(h, v);
  return h == 0 ? 1 : h;
}

}  // namespace board

namespace {

uint64_t load(const uint64_t* word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }
void store(uint64_t* word, uint64_t value) { __atomic_store_n(word, value, __ATOMIC_RELEASE); }
bool reached(uint64_t value, uint64_t target) { return static_cast<int64_t>(value - target) >= 0; }

// "1000 elements on windows 2 and 3 at offsets 4096 and in place"
std::string describeCall(const WindowCall& call) {
  auto offset = [](uint64_t at) { return at == kInPlaceOffset ? std::string("in place") : std::to_string(at); };
  return str(call.count, " elements on windows ", call.sendRegistration, " and ", call.recvRegistration,
             " at offsets ", offset(call.sendOffset), " and ", offset(call.recvOffset));
}

}  // namespace

// The messages of a windowed plan between this rank and rank q, as stream
// memory operations on the two boards.
class BoardLink final : public StreamLink {
 public:
  BoardLink(cuda::Driver& driver, uint64_t* own, uint64_t* peer, int rank, int nranks, int q, const WindowCall& call)
      : driver_(driver), own_(own), peer_(peer), q_(q), call_(call),
        description_(str("rank ", q, " (window board)")), toPeer_(peer + board::slot(rank)),
        fromPeer_(own + board::slot(q)), passed_(own + board::passed(nranks, q)) {}

  const std::string& peerDescription() const override { return description_; }

  Status enqueueSend(const void*, uint64_t bytes, uint64_t tag, void* stream) override {
    SHOAL_TRY(usable());
    // One batch of stream writes into this rank's slot of the peer's board:
    // a descriptor's words, the hash (the word the peer waits on) after
    // them, then the message count.
    std::array<cuda::Driver::WordWrite, 8> words;
    size_t n = 0;
    if (bytes == kWindowSlotBytes) {
      const uint64_t sequence = ++descriptorsSent_;
      words[n++] = {board::kTag, tag};
      words[n++] = {board::kCount, call_.count};
      words[n++] = {board::kSendRegistration, call_.sendRegistration};
      words[n++] = {board::kRecvRegistration, call_.recvRegistration};
      words[n++] = {board::kSendOffset, call_.sendOffset};
      words[n++] = {board::kRecvOffset, call_.recvOffset};
      words[n++] = {board::kHash, board::hash(tag, call_, sequence)};
    } else if (bytes != 0) {
      return internalError("a window board carries descriptors and barriers, not ", bytes, "-byte messages");
    }
    words[n++] = {board::kMessages, sent_.load() + 1};
    SHOAL_TRY(driver_.writeValuesAsync(toPeer_, std::span(words.data(), n), stream));
    sent_.fetch_add(1);
    return Status::ok();
  }

  Status enqueueRecv(void*, uint64_t bytes, uint64_t tag, void* stream) override {
    SHOAL_TRY(usable());
    const uint64_t message = expected_.load() + 1;
    if (bytes == kWindowSlotBytes) {
      const uint64_t sequence = ++descriptorsExpected_;
      const uint64_t value = board::hash(tag, call_, sequence);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        pending_.push_back(Pending{sequence, message, value, tag, call_});
      }
      SHOAL_TRY(driver_.waitValueEqualAsync(fromPeer_ + board::kHash, value, stream));
      SHOAL_TRY(driver_.writeValueAsync(passed_, sequence, stream));
    } else if (bytes == 0) {
      SHOAL_TRY(driver_.waitValueAsync(fromPeer_ + board::kMessages, message, stream));
    } else {
      return internalError("a window board carries descriptors and barriers, not ", bytes, "-byte messages");
    }
    expected_.store(message);
    return Status::ok();
  }

  Progress progress() const override {
    Progress p;
    p.sendEnqueued = sent_.load();
    p.sent = load(toPeer_ + board::kMessages);  // what this rank's streams have written
    p.sendWaitsForPeer = false;  // a signal not yet written is behind a wait of this rank's
    p.recvEnqueued = expected_.load();
    p.received = load(fromPeer_ + board::kMessages);
    return p;
  }

  Status verify() override {
    SHOAL_TRY(usable());
    std::lock_guard<std::mutex> lock(mutex_);
    while (!pending_.empty()) {
      const Pending& e = pending_.front();
      if (reached(load(passed_), e.sequence)) {
        pending_.pop_front();
        continue;
      }
      if (!reached(load(fromPeer_ + board::kMessages), e.message)) break;  // not sent yet
      WindowCall theirs;
      const uint64_t tag = load(fromPeer_ + board::kTag);
      theirs.count = load(fromPeer_ + board::kCount);
      theirs.sendRegistration = load(fromPeer_ + board::kSendRegistration);
      theirs.recvRegistration = load(fromPeer_ + board::kRecvRegistration);
      theirs.sendOffset = load(fromPeer_ + board::kSendOffset);
      theirs.recvOffset = load(fromPeer_ + board::kRecvOffset);
      if (load(fromPeer_ + board::kHash) == e.value) break;  // it passes
      // The stream may have passed it meanwhile, and the peer moved on.
      if (reached(load(passed_), e.sequence)) continue;
      return invalidUsage("rank ", q_, " called ", describeTag(tag), " of ", describeCall(theirs),
                          "; this rank called ", describeTag(e.tag), " of ", describeCall(e.call),
                          " (windows registered with NCCL_WIN_COLL_SYMMETRIC take the same operations at the same "
                          "offsets on every rank)");
    }
    return Status::ok();
  }

  void release() override {
    store(own_ + board::kBroken, 1);
    // Far past every count this rank waits for (the waits compare
    // cyclically), and the descriptor its streams wait for now; called
    // again while they drain (rank q's streams may write the words back,
    // and the next descriptor is waited for once this one has passed).
    constexpr uint64_t kReleased = 1ull << 40;
    store(fromPeer_ + board::kMessages, expected_.load() + kReleased);
    std::lock_guard<std::mutex> lock(mutex_);
    while (!pending_.empty() && reached(load(passed_), pending_.front().sequence)) pending_.pop_front();
    if (!pending_.empty()) store(fromPeer_ + board::kHash, pending_.front().value);
  }

 private:
  Status usable() const {
    if (load(own_ + board::kBroken) != 0 || load(peer_ + board::kBroken) != 0)
      return remoteError(description_, ": the window board is broken (an operation on windows failed, on this "
                         "rank or rank ", q_, "; see the first error)");
    return Status::ok();
  }

  struct Pending {
    uint64_t sequence;  // descriptors from rank q
    uint64_t message;   // messages from rank q
    uint64_t value;     // the hash this rank waits for
    uint64_t tag;
    WindowCall call;
  };

  cuda::Driver& driver_;
  uint64_t* own_;
  uint64_t* peer_;
  int q_;
  const WindowCall& call_;
  std::string description_;
  uint64_t* toPeer_;    // this rank's slot in rank q's board
  uint64_t* fromPeer_;  // rank q's slot in this rank's board
  uint64_t* passed_;
  std::atomic<uint64_t> sent_{0}, expected_{0};  // messages enqueued, per direction
  uint64_t descriptorsSent_ = 0, descriptorsExpected_ = 0;
  std::mutex mutex_;
  std::deque<Pending> pending_;  // descriptor waits the streams may not have passed
};

Result<std::shared_ptr<WindowBoards>> WindowBoards::create(cuda::Driver& driver, int rank, int nranks) {
  SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<BoardMemory> own, BoardMemory::create(driver, board::bytes(nranks)));
  return std::shared_ptr<WindowBoards>(new WindowBoards(driver, rank, nranks, std::move(own)));
}

WindowBoards::WindowBoards(cuda::Driver& driver, int rank, int nranks, std::shared_ptr<BoardMemory> own)
    : driver_(driver), rank_(rank), nranks_(nranks), own_(std::move(own)) {
  boards_.resize(static_cast<size_t>(nranks));
  links_.resize(static_cast<size_t>(nranks));
  boards_[static_cast<size_t>(rank)] = own_;
}

WindowBoards::~WindowBoards() = default;

uint64_t WindowBoards::address() const { return own_->address(); }
int WindowBoards::descriptor() const { return own_->descriptor(); }
bool WindowBoards::has(int q) const { return boards_[static_cast<size_t>(q)] != nullptr; }

Status WindowBoards::attach(int q, std::shared_ptr<BoardMemory> memory) {
  boards_[static_cast<size_t>(q)] = memory;
  links_[static_cast<size_t>(q)] =
      std::make_unique<BoardLink>(driver_, own_->words(), memory->words(), rank_, nranks_, q, call_);
  return Status::ok();
}

Status WindowBoards::adopt(int q, net::Fd descriptor) {
  if (has(q)) return Status::ok();
  SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<BoardMemory> memory,
                         BoardMemory::map(driver_, std::move(descriptor), board::bytes(nranks_)),
                         "rank ", q, "'s window board");
  return attach(q, std::move(memory));
}

Status WindowBoards::adoptLocal(int q, uint64_t address) {
  if (has(q)) return Status::ok();
  std::shared_ptr<BoardMemory> memory = BoardMemory::find(address);
  if (!memory) return internalError("rank ", q, "'s window board at ", address, " is not in this process");
  return attach(q, std::move(memory));
}

void WindowBoards::setCall(const WindowCall& call) { call_ = call; }

StreamLink* WindowBoards::link(int q) { return links_[static_cast<size_t>(q)].get(); }

}  // namespace shoal
