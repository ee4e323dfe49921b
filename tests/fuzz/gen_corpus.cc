// gen_corpus: writes the seed corpora corpus/<target>/ with the library's own
// encoders (store_protocol.h's Writer, encodeUniqueId, the hellos'
// encode/sign, a real TcpConnection and ShmConnection sending, PeerInfo::
// serialize, the address formatters, describeParams), plus edge cases.
//
//   build/fuzz/fuzz_gen_corpus tests/fuzz/corpus
//
// Run it again after changing an encoder or a harness's input layout, and
// commit the files. It only adds or overwrites its own seeds (gen_*), so
// inputs found by fuzzing that were added to the corpus stay.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/store_protocol.h"
#include "core/params.h"
#include "core/tag.h"
#include "fuzz_common.h"
#include "net/socket_address.h"
#include "transports/cuda_ipc/cuda_ipc_transport.h"
#include "transports/shm/shm_connection.h"
#include "transports/shm/shm_segment.h"
#include "transports/shm/shm_transport.h"
#include "transports/tcp/tcp_connection.h"
#include "transports/tcp/tcp_transport.h"
#include "transports/transport.h"
#if SHOAL_FUZZ_WITH_OFI
#include "transports/ofi/ofi_fabric.h"
#include "transports/ofi/ofi_transport.h"
#endif

namespace {

using namespace shoal;
using Bytes = std::vector<uint8_t>;
using bootstrap_wire::Writer;
using bootstrap_wire::beginFrame;
using bootstrap_wire::finishFrame;

std::string gRoot;
int gWritten = 0;

void put(const std::string& target, const std::string& name, const void* data, size_t size) {
  std::string dir = gRoot + "/" + target;
  ::mkdir(gRoot.c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
  std::string path = dir + "/gen_" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  ++gWritten;
}
void put(const std::string& target, const std::string& name, const Bytes& b) { put(target, name, b.data(), b.size()); }
void put(const std::string& target, const std::string& name, const std::string& s) {
  put(target, name, s.data(), s.size());
}

void le(Bytes& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void append(Bytes& out, const Bytes& more) { out.insert(out.end(), more.begin(), more.end()); }

// --- bootstrap store

Bytes frame(uint64_t id, uint8_t kind, const std::function<void(Writer&)>& body) {
  Bytes out;
  Writer w(out);
  size_t at = beginFrame(w, id, kind);
  body(w);
  finishFrame(w, at);
  return out;
}
Bytes keysFrame(uint64_t id, uint8_t command, const std::vector<std::string>& keys, bool withTimeout = false,
                uint32_t timeoutMs = 0) {
  return frame(id, command, [&](Writer& w) {
    if (withTimeout) w.u32(timeoutMs);
    w.u32(static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
  });
}
Bytes setFrame(uint64_t id, const std::string& key, const std::string& value) {
  return frame(id, bootstrap_wire::kSet, [&](Writer& w) {
    w.str(key);
    w.str(value);
  });
}

Bytes willFrame(uint64_t id, const std::string& key, const std::string& value) {
  return frame(id, bootstrap_wire::kWill, [&](Writer& w) {
    w.str(key);
    w.str(value);
  });
}

Bytes cancelWillFrame(uint64_t id, const std::string& key) {
  return frame(id, bootstrap_wire::kCancelWill, [&](Writer& w) { w.str(key); });
}

// Harness steps (fuzz_store_server.cc).
void stepData(Bytes& out, int conn, const Bytes& bytes) {
  out.push_back(static_cast<uint8_t>(0 | (conn << 2)));
  le(out, bytes.size(), 2);
  append(out, bytes);
}
void stepClose(Bytes& out, int conn) { out.push_back(static_cast<uint8_t>(1 | (conn << 2))); }
void stepExpire(Bytes& out, uint16_t ms) {
  out.push_back(2);
  le(out, ms, 2);
}
void stepReap(Bytes& out) { out.push_back(3); }

Bytes clientHello(uint64_t magic, uint32_t tag = bootstrap_wire::kHandshakeTag,
                  uint16_t version = bootstrap_wire::kVersion) {
  Bytes out;
  Writer w(out);
  w.u32(tag);
  w.u16(version);
  w.u16(0);
  w.u64(magic);
  for (int i = 0; i < 16; ++i) w.u8(static_cast<uint8_t>(0xa0 + i));
  return out;
}

void storeServerSeeds() {
  using namespace bootstrap_wire;
  const std::string t = "store_server";
  {
    Bytes in = {0};
    Bytes frames;
    append(frames, setFrame(1, "rank0", "address of rank 0"));
    append(frames, keysFrame(2, kGet, {"rank0"}, true, 1000));
    append(frames, keysFrame(3, kCheck, {"rank0", "rank1"}));
    append(frames, keysFrame(4, kErase, {"rank0"}));
    append(frames, keysFrame(5, kGet, {"rank1"}, true, 5));
    stepData(in, 0, frames);
    stepExpire(in, 10);
    stepReap(in);
    put(t, "ready_every_command", in);
  }
  {
    Bytes in = {1 | 4};  // conn 0 says hello; the harness proves the secret
    stepData(in, 0, clientHello(shoal_fuzz::kStoreTenantMagic));
    stepData(in, 0, setFrame(1, "k", "v"));
    stepData(in, 0, keysFrame(2, kGet, {"k"}, true, kNoTimeout));
    put(t, "hello_then_frames", in);
  }
  {
    Bytes in = {1};  // a hello whose proof the harness does not give
    stepData(in, 0, clientHello(shoal_fuzz::kStoreTenantMagic));
    Bytes proof(32, 0x55);
    stepData(in, 0, proof);
    put(t, "hello_wrong_proof", in);
  }
  {
    Bytes in = {1};
    stepData(in, 0, clientHello(0x1234));
    put(t, "hello_unknown_id", in);
    Bytes in2 = {1};
    stepData(in2, 0, clientHello(shoal_fuzz::kStoreTenantMagic, 0x47455420, 1));  // "GET "
    put(t, "hello_not_shoal", in2);
    Bytes in3 = {1};
    stepData(in3, 0, clientHello(shoal_fuzz::kStoreTenantMagic, kHandshakeTag, 9));
    put(t, "hello_future_version", in3);
  }
  {
    // Connection 1 waits for a key that connection 0 then sets.
    Bytes in = {0};
    stepData(in, 1, keysFrame(7, kGet, {"a", "b", "a"}, true, kNoTimeout));
    stepData(in, 0, setFrame(1, "a", "1"));
    stepData(in, 0, keysFrame(2, kErase, {"a"}));
    stepData(in, 0, setFrame(3, "b", "2"));
    stepData(in, 0, setFrame(4, "a", "3"));
    put(t, "two_conns_waiter", in);
  }
  {
    // Connection 0 leaves wills and goes away: one is cancelled, one meets
    // a key that exists, one answers connection 1's waiting GET.
    Bytes in = {0};
    stepData(in, 1, keysFrame(7, kGet, {"failure/0"}, true, kNoTimeout));
    Bytes frames;
    append(frames, willFrame(1, "failure/0", "its process ended"));
    append(frames, willFrame(2, "other", "never"));
    append(frames, cancelWillFrame(3, "other"));
    append(frames, willFrame(4, "k", "not this"));
    append(frames, setFrame(5, "k", "own"));
    stepData(in, 0, frames);
    stepClose(in, 0);
    stepReap(in);
    put(t, "wills_then_close", in);
  }
  {
    // A frame cut across reads, then its waiter's connection goes away.
    Bytes f = keysFrame(9, kGet, {"never"}, true, 100);
    Bytes first(f.begin(), f.begin() + 6), second(f.begin() + 6, f.end());
    Bytes in = {0};
    stepData(in, 0, first);
    stepData(in, 0, second);
    stepClose(in, 0);
    stepReap(in);
    stepExpire(in, 200);
    put(t, "split_frame_then_close", in);
  }
  {
    Bytes in = {0};
    Bytes bad;
    Writer w(bad);
    w.u32(5);  // shorter than {id, command}
    w.u64(1);
    w.u8(kSet);
    stepData(in, 0, bad);
    put(t, "frame_too_short", in);
    Bytes in2 = {0};
    stepData(in2, 0, frame(1, 9, [](Writer&) {}));
    put(t, "unknown_command", in2);
    Bytes in3 = {0};
    Bytes huge;
    Writer w3(huge);
    w3.u32(kMaxFrameBytes + 1);
    stepData(in3, 0, huge);
    put(t, "frame_too_long", in3);
    Bytes in4 = {0};
    stepData(in4, 0, frame(1, kGet, [](Writer& w) {
                w.u32(0);
                w.u32(0x40000000);  // a count no body can hold
              }));
    stepData(in4, 0, frame(2, kSet, [](Writer& w) { w.str("only a key"); }));
    put(t, "malformed_bodies", in4);
  }
}

Bytes reply(uint64_t id, uint8_t status, const std::function<void(Writer&)>& body) { return frame(id, status, body); }

void storeClientSeeds() {
  using namespace bootstrap_wire;
  const std::string t = "store_client";
  auto seed = [&](const std::string& name, int op, int keys, const Bytes& root) {
    Bytes in = {static_cast<uint8_t>(op), static_cast<uint8_t>(keys)};
    append(in, root);
    put(t, name, in);
  };
  seed("set_ok", 0, 1, reply(1, kOk, [](Writer&) {}));
  seed("set_bad_request", 0, 1, reply(1, kBadRequest, [](Writer& w) { w.str("malformed SET"); }));
  seed("get_ok", 1, 2, reply(1, kOk, [](Writer& w) {
         w.u32(2);
         w.str("value0");
         w.str("value1");
       }));
  seed("get_timeout", 1, 3, reply(1, kTimeout, [](Writer& w) {
         w.u32(2);
         w.str("key1");
         w.str("key2");
       }));
  {
    Bytes root = reply(5, kOk, [](Writer&) {});  // a reply to nobody, then ours
    append(root, reply(1, kOk, [](Writer& w) {
             w.u32(1);
             w.str("v");
           }));
    seed("get_after_stray_reply", 1, 1, root);
  }
  seed("get_count_mismatch", 1, 2, reply(1, kOk, [](Writer& w) {
         w.u32(1);
         w.str("v");
       }));
  seed("erase_ok", 2, 4, reply(1, kOk, [](Writer&) {}));
  seed("check_ok", 3, 3, reply(1, kOk, [](Writer& w) {
         w.u32(3);
         w.u8(1);
         w.u8(0);
         w.u8(1);
       }));
  seed("check_unexpected_status", 3, 1, reply(1, 7, [](Writer&) {}));
  {
    Bytes root;
    Writer w(root);
    w.u32(4);  // shorter than {id, status}
    seed("reply_too_short", 1, 1, root);
  }
  {
    Bytes root;
    Writer w(root);
    w.u32(kHandshakeTag);
    w.u16(kVersion);
    w.u16(0);
    for (int i = 0; i < 16; ++i) w.u8(static_cast<uint8_t>(i));
    for (int i = 0; i < 32; ++i) w.u8(0);
    w.u32(kAcceptTag);
    seed("handshake_challenge", 4, 0, root);
  }
}

void uniqueIdSeeds() {
  const std::string t = "unique_id";
  auto seed = [&](const std::string& name, const std::string& address, uint64_t magic) {
    UniqueIdContents id;
    id.magic = magic;
    for (int i = 0; i < 32; ++i) id.secret[i] = static_cast<uint8_t>(i * 7 + 1);
    id.address = address;
    char out[UniqueIdContents::kBytes];
    encodeUniqueId(id, out);
    put(t, name, out, sizeof(out));
  };
  seed("ipv4", "10.1.2.3:29500", 0x1122334455667788ull);
  seed("ipv4_loopback", "127.0.0.1:1", 0xffffffffffffffffull);
  seed("ipv6", "[2001:db8::7]:65535", 42);
  seed("ipv6_scoped", "[fe80::1%3]:4000", 43);
  seed("ipv6_v4_mapped", "[::ffff:192.168.0.1]:80", 44);
  seed("comm_id_magic", "192.168.1.1:29500", 0x0280028002800280ull);
}

void commIdSeeds() {
  const std::string t = "comm_id";
  uint8_t v4[4] = {10, 0, 0, 1};
  put(t, "ipv4", net::SocketAddress::fromIpv4(v4, 29500).toString());
  uint8_t v6[16] = {0x20, 0x01, 0x0d, 0xb8};
  v6[15] = 1;
  put(t, "ipv6", net::SocketAddress::fromIpv6(v6, 29500).toString());
  uint8_t ll[16] = {0xfe, 0x80};
  ll[15] = 1;
  put(t, "ipv6_scope_id", net::SocketAddress::fromIpv6(ll, 1, 2).toString());
  put(t, "ipv6_scope_name", std::string("[fe80::1%lo]:65535"));
  put(t, "ipv6_v4_mapped", std::string("[::ffff:127.0.0.1]:0"));
  put(t, "port_out_of_range", std::string("127.0.0.1:65536"));
  put(t, "bare_ipv6", std::string("::1:80"));
  put(t, "host_name", std::string("localhost:29500"));
}

void socketIfnameSeeds() {
  const std::string t = "socket_ifname";
  // Line 1 NCCL_SOCKET_IFNAME, line 2 NCCL_SOCKET_FAMILY, then "<flags><name>".
  put(t, "prefix", std::string("eth\n\n\x01" "eth0\n\x01" "eth1\n\x03" "lo\n\x05" "eth0"));
  put(t, "exclude", std::string("^docker,lo\nAF_INET\n\x01" "docker0\n\x03" "lo\n\x01" "ens3\n\x0d" "ens3"));
  put(t, "exact", std::string("=eth0\nAF_INET6\n\x01" "eth0\n\x05" "eth0\n\x01" "eth01"));
  put(t, "exclude_exact", std::string("^=lo, eth1 ,ib0:1\n4\n\x01" "ib0\n\x01" "eth1\n\x03" "lo"));
  put(t, "default_rules", std::string("\n\n\x01" "ib0\n\x01" "docker0\n\x00" "eth0\n\x03" "lo"));
  put(t, "bad_family", std::string("eth\nAF_UNIX\n\x01" "eth0"));
}

void confFileSeeds() {
  const std::string t = "conf_file";
  std::string all;
  for (const ParamInfo& p : describeParams()) {
    std::string def = p.defaultValue;
    if (def.size() >= 2 && def.front() == '"') def = def.substr(1, def.size() - 2);
    all += std::string(p.env) + "=" + def + "\n";
  }
  put(t, "every_default", all);
  put(t, "edge_cases",
      std::string("# comment\nNCCL_SOCKET_NTHREADS=0x10\nNCCL_SOCKET_NTHREADS=3\nNCCL_SHM_DISABLE=yes\n"
                  "no equals sign\n=empty name\nSHOAL_SHM_CMA=maybe\nNCCL_DEBUG=INFO=x\n"
                  "SHOAL_INIT_TIMEOUT_MS=99999999999999999999\nNCCL_NSOCKS_PERTHREAD=\r\n"));
}

void loopbackSeeds() {
  const std::string t = "loopback_faults";
  put(t, "every_fault", std::string("delay_us=50,reorder_seed=7,fail_nth=100,blackhole_nth=3"));
  put(t, "fail_first", std::string("fail_nth=1\n\x03"));
  put(t, "blackhole_second", std::string("blackhole_nth=2\n\x02"));
  put(t, "reorder", std::string("reorder_seed=0x1234\n\x03"));
  put(t, "delay", std::string("delay_us=1"));
  put(t, "empty_items", std::string(",,delay_us=0,"));
  put(t, "unknown", std::string("bogus=1"));
  put(t, "bad_number", std::string("delay_us=12abc"));
}

// --- transports

void peerInfoSeeds() {
  const std::string t = "peer_info";
  PeerInfo p;
  p.rank = 3;
  p.hostname = "node-a";
  p.hostId = "node-a:1234-5678";
  p.processId = 0x123456789abcull;
  p.kernelId = "8d6f1c2e-0000-4000-8000-000000000001";
  p.gpu = "GPU-00000000-1111-2222-3333-444444444444";
  p.addresses = {{"tcp", "10.0.0.1:4431"}, {"shm", "4242:boot:7f00001000:1234"}, {"ofi", "tcp;ofi_rxm/0a0b"}};
  std::string full = p.serialize();
  put(t, "full", full);
  // A writer that predates kernelId and gpu: the record stops before them.
  size_t cut = full.size() - (4 + p.gpu.size()) - (4 + p.kernelId.size());
  put(t, "old_writer", full.substr(0, cut));
  PeerInfo empty;
  put(t, "empty", empty.serialize());
  PeerInfo many;
  many.rank = -1;
  for (int i = 0; i < 64; ++i) many.addresses.emplace_back("t" + std::to_string(i), "");
  put(t, "sixty_four_addresses", many.serialize());
}

void tcpHelloSeeds() {
  const std::string t = "tcp_hello";
  auto seed = [&](const std::string& name, uint16_t sockets, uint16_t index, uint32_t chunk) {
    tcp::Hello h;
    h.commId = 0xc0ffee;
    h.fromRank = 0;
    h.toRank = 1;
    h.channel = 2;
    h.sockets = sockets;
    h.socketIndex = index;
    h.chunkBytes = chunk;
    Status s = tcp::signHello(h, "fuzz secret");
    if (!s.isOk()) std::exit(1);
    uint8_t out[tcp::kHelloBytes];
    tcp::encodeHello(h, out);
    put(t, name, out, sizeof(out));
  };
  seed("one_socket", 1, 0, 524288);
  seed("last_of_64", 64, 63, 4096);
  seed("largest_chunk", 2, 1, 1u << 30);
}

void cudaIpcHelloSeeds() {
  const std::string t = "cuda_ipc_hello";
  auto seed = [&](const std::string& name, uint32_t slots, uint64_t slotBytes, bool streamRing) {
    cuda_ipc::Hello h;
    h.commId = 0xc0ffee;
    h.fromRank = 0;
    h.toRank = 1;
    h.channel = 2;
    h.slots = slots;
    h.slotBytes = slotBytes;
    h.allocationBytes = (cuda_ipc::kFifoLanes * slots * slotBytes + (2 << 20) - 1) / (2 << 20) * (2 << 20);
    h.streamRing = streamRing;
    Status s = cuda_ipc::signHello(h, "fuzz secret");
    if (!s.isOk()) std::exit(1);
    uint8_t out[cuda_ipc::kHelloBytes];
    cuda_ipc::encodeHello(h, out);
    put(t, name, out, sizeof(out));
  };
  seed("default", 8, 1 << 20, true);
  seed("smallest_slots", 1, 8 << 10, false);
  seed("largest_slots", 64, 128ull << 20, true);
}

// The bytes a real TcpConnection puts on each lane for `sizes`.
// corruptAt >= 0: that byte of lane 0's first segment header is flipped (0
// tag, 8 size, 16 message number, 20 slice), which the receiver must refuse.
void tcpSegmentSeed(const std::string& name, int lanes, int chunkIndex, const std::vector<uint64_t>& sizes,
                    int corruptAt = -1) {
  static const uint64_t kChunks[4] = {4096, 16384, 65536, 131072};
  std::vector<net::Fd> fds;
  std::vector<int> peer;
  for (int i = 0; i < lanes; ++i) {
    shoal_fuzz::SocketPair pair = shoal_fuzz::SocketPair::make();
    fds.emplace_back(pair.a);
    peer.push_back(pair.b);
  }
  tcp::TcpConnection conn(std::move(fds), kChunks[chunkIndex], "seed peer");
  std::vector<Bytes> payloads;
  std::vector<uint64_t> tags;
  for (size_t i = 0; i < sizes.size(); ++i) {
    payloads.emplace_back(sizes[i]);
    for (uint64_t j = 0; j < sizes[i]; ++j) payloads.back()[j] = static_cast<uint8_t>(j * 31 + i);
    tags.push_back(encodeTag(CollKind::kAllReduce, DataType::kFloat32, sizes[i] / 4, 0, -1, i));
    if (!conn.postSend(payloads.back().data(), sizes[i], tags.back(), i).isOk()) std::exit(1);
  }
  std::vector<Bytes> streams(static_cast<size_t>(lanes));
  size_t finished = 0;
  for (int guard = 0; guard < 100000 && finished < sizes.size(); ++guard) {
    std::vector<Completion> done;
    bool progressed = false;
    if (!conn.poll(done, progressed).isOk()) std::exit(1);
    finished += done.size();
    for (int i = 0; i < lanes; ++i) {
      uint8_t buf[65536];
      ssize_t n;
      while ((n = ::recv(peer[i], buf, sizeof(buf), MSG_DONTWAIT)) > 0) streams[i].insert(streams[i].end(), buf, buf + n);
    }
  }
  for (int fd : peer) ::close(fd);
  if (corruptAt >= 0) streams[0][static_cast<size_t>(corruptAt)] ^= 1;
  Bytes in;
  in.push_back(static_cast<uint8_t>((lanes - 1) | (chunkIndex << 2)));
  in.push_back(3);  // pieces of 22 bytes in the second run
  in.push_back(static_cast<uint8_t>(sizes.size() - 1));
  for (size_t i = 0; i < sizes.size(); ++i) {
    le(in, sizes[i], 4);
    le(in, tags[i], 8);
  }
  for (const Bytes& s : streams) {
    if (s.size() > 65535) {
      std::fprintf(stderr, "tcp seed %s: a lane carries more than 64 KiB\n", name.c_str());
      std::exit(1);
    }
    le(in, s.size(), 2);
    append(in, s);
  }
  put("tcp_segments", name, in);
}

void tcpSegmentSeeds() {
  tcpSegmentSeed("one_lane_small", 1, 0, {0, 1, 100});
  tcpSegmentSeed("two_lanes_striped", 2, 0, {9000, 8, 5000});
  tcpSegmentSeed("four_lanes_rotating", 4, 1, {64, 64, 64, 64, 20000});
  tcpSegmentSeed("direct_reads", 2, 2, {9000, 12000});
  tcpSegmentSeed("wrong_tag", 1, 0, {16, 16}, 0);
  tcpSegmentSeed("wrong_size", 2, 0, {5000}, 8);
  tcpSegmentSeed("wrong_message_number", 1, 0, {1, 1}, 16);
  tcpSegmentSeed("wrong_slice", 2, 0, {9000}, 20);
}

// Frames a real ShmConnection writes into its ring, in fuzz_shm_ring's layout.
// corrupt: the first frame's tag (1) or message size (2) is changed, which
// the receiver must refuse.
void shmRingSeed(const std::string& name, const std::vector<uint64_t>& sizes, bool reduce, uint8_t flags,
                 int corrupt = 0) {
  std::string segName = shm::segmentName(getpid(), 0x5eed0000ull + static_cast<uint64_t>(gWritten), 0, 1, 0);
  Result<shm::Segment> created = shm::Segment::create(segName, 64 << 10, "seed", shm::CmaAbility::kNo);
  if (!created.isOk()) std::exit(1);
  shm::Header& h = created.value().header();
  h.canRead[1].store(static_cast<int32_t>(shm::CmaAbility::kNo));  // the "opener" refuses single copy
  h.openerPid.store(getpid());
  const uint8_t* ring = created.value().ring(0);
  uint64_t ringBytes = created.value().ringBytes();
  shm::ConnectionSetup setup;
  setup.side = 0;
  setup.segmentName = segName;
  setup.secret = "seed";
  setup.segment = std::move(created.value());
  setup.peerPid = getpid();
  setup.selfCanRead = shm::CmaAbility::kNo;
  setup.cmaMinBytes = 64 << 10;
  setup.peerDescription = "seed peer";
  shm::ShmConnection conn(std::move(setup));
  std::vector<Bytes> payloads;
  std::vector<uint64_t> tags;
  for (size_t i = 0; i < sizes.size(); ++i) {
    payloads.emplace_back(sizes[i]);
    for (uint64_t j = 0; j < sizes[i]; ++j) payloads.back()[j] = static_cast<uint8_t>(j + i);
    tags.push_back(encodeTag(CollKind::kReduceScatter, DataType::kFloat32, sizes[i] / 4, 0, -1, i));
    if (!conn.postSend(payloads.back().data(), sizes[i], tags.back(), i).isOk()) std::exit(1);
  }
  for (int i = 0; i < 100; ++i) {
    std::vector<Completion> done;
    bool progressed = false;
    if (!conn.poll(done, progressed).isOk()) std::exit(1);
  }
  Bytes in;
  in.push_back(flags);
  in.push_back(0);  // ring of 64 KiB
  in.push_back(static_cast<uint8_t>(sizes.size() - 1));
  for (size_t i = 0; i < sizes.size(); ++i) {
    le(in, sizes[i], 4);
    le(in, tags[i], 8);
    in.push_back(reduce ? 1 : 0);                                // reduce with sum
    in.push_back(static_cast<uint8_t>(DataType::kFloat32));    // float
  }
  // Walk the ring as the receiver does: {stamp, tag, bytes, frame bytes, kind}.
  uint64_t slot = 0, capacity = ringBytes / shm::kSlotBytes;
  for (uint64_t frameNo = 1;; ++frameNo) {
    const uint8_t* p = ring + (slot % capacity) * shm::kSlotBytes;
    uint64_t stamp, tag, bytes;
    uint32_t frameBytes, kind;
    std::memcpy(&stamp, p, 8);
    if (stamp != frameNo) break;
    std::memcpy(&tag, p + 8, 8);
    std::memcpy(&bytes, p + 16, 8);
    std::memcpy(&frameBytes, p + 24, 4);
    std::memcpy(&kind, p + 28, 4);
    if (frameNo == 1 && corrupt == 1) tag ^= 1;
    if (frameNo == 1 && corrupt == 2) bytes += 1;
    le(in, tag, 8);
    le(in, bytes, 8);
    le(in, frameBytes, 4);
    le(in, kind, 4);
    le(in, frameBytes, 2);
    uint64_t start = (slot % capacity) * shm::kSlotBytes + 32;
    for (uint32_t j = 0; j < frameBytes; ++j) in.push_back(ring[(start + j) % ringBytes]);
    slot += (32 + frameBytes + shm::kSlotBytes - 1) / shm::kSlotBytes;
  }
  put("shm_ring", name, in);
}

void shmRingSeeds() {
  shmRingSeed("small_frames", {8, 100, 0, 32}, false, 0);
  shmRingSeed("multi_frame_message", {17000, 4}, false, 0);
  shmRingSeed("reduce_on_receive", {256, 16800}, true, 0);
  shmRingSeed("peer_reports_failure", {16}, false, 4);
  shmRingSeed("wrong_tag", {16, 16}, false, 0, 1);
  shmRingSeed("wrong_size", {100}, false, 0, 2);
  {
    // A single-copy frame (its address 0: the harness points it at its own buffer).
    Bytes in = {2, 0, 0};
    le(in, 70000, 4);
    le(in, 77, 8);
    in.push_back(0);
    in.push_back(0);
    le(in, 77, 8);
    le(in, 70000, 8);
    le(in, 8, 4);
    le(in, 1, 4);
    le(in, 8, 2);
    le(in, 0, 8);
    put("shm_ring", "single_copy", in);
  }
  {
    // A forged header that says what the real one says, then one frame.
    Bytes in = {1, 0};
    le(in, 0, 4);          // version xor 2: the expected version
    le(in, 64 << 10, 4);   // ring bytes
    le(in, 0, 4);          // the file size the ring implies
    in.push_back(0);       // one receive
    le(in, 5, 4);
    le(in, 9, 8);
    in.push_back(0);
    in.push_back(0);
    le(in, 9, 8);
    le(in, 5, 8);
    le(in, 5, 4);
    le(in, 0, 4);
    le(in, 5, 2);
    for (int i = 0; i < 5; ++i) in.push_back(static_cast<uint8_t>('a' + i));
    put("shm_ring", "forged_header_valid", in);
  }
}

void shmAddressSeeds() {
  const std::string t = "shm_address";
  shm::Address a;
  a.pid = 4242;
  a.bootId = "8d6f1c2e-0000-4000-8000-000000000001";
  a.probeAddress = 0x7ffc12345678ull;
  a.probeValue = 0xfeedfacecafebeefull;
  put(t, "typical", shm::formatAddress(a));
  a.pid = 2147483647;
  a.bootId = std::string(63, 'b');
  a.probeAddress = ~0ull;
  a.probeValue = 0;
  put(t, "longest_boot_id", shm::formatAddress(a));
  put(t, "boot_id_too_long", std::string("1:") + std::string(80, 'c') + ":1:2");
  put(t, "negative_pid", std::string("-5:boot:10:20"));
}

#if SHOAL_FUZZ_WITH_OFI
void ofiSeeds() {
  {
    const std::string t = "ofi_hello";
    ofi::wire::Hello h;
    h.commId = 0xabcdef;
    h.fromRank = 1;
    h.toRank = 0;
    h.channel = 3;
    h.recvId = 17;
    h.clearAbove = 131072;
    if (!ofi::wire::signHello(h, "fuzz secret").isOk()) std::exit(1);
    uint8_t out[ofi::wire::kHelloBytes];
    ofi::wire::encodeHello(h, out);
    put(t, "typical", out, sizeof(out));
    h.recvId = ofi::wire::kMaxId;
    h.clearAbove = 0;
    ofi::wire::encodeHello(h, out);
    put(t, "largest_id", out, sizeof(out));
    put(t, "one_byte_short", out, sizeof(out) - 1);
  }
  {
    const std::string t = "ofi_address";
    ofi::Address a;
    a.provider = "tcp;ofi_rxm";
    std::string sin(16, '\0');
    sin[0] = 2;
    sin[2] = 0x11;
    sin[4] = 127;
    sin[7] = 1;
    a.rails = {{sin, sin}};
    put(t, "tcp_two_endpoints", ofi::formatAddress(a));
    a.provider = "shm";
    a.rails = {{"fi_shm://4242"}, {"fi_shm://4243"}};
    put(t, "shm_two_rails", ofi::formatAddress(a));
    a.provider = "efa";
    a.rails = {std::vector<std::string>(16, std::string(32, '\x5a'))};
    put(t, "sixteen_endpoints", ofi::formatAddress(a));
    put(t, "old_single_endpoint", std::string("verbs;ofi_rxm/0a0b0c0d"));
    put(t, "odd_hex", std::string("tcp/abc"));
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus directory>\n", argv[0]);
    return 2;
  }
  gRoot = argv[1];
  storeServerSeeds();
  storeClientSeeds();
  uniqueIdSeeds();
  commIdSeeds();
  socketIfnameSeeds();
  confFileSeeds();
  loopbackSeeds();
  peerInfoSeeds();
  tcpHelloSeeds();
  cudaIpcHelloSeeds();
  tcpSegmentSeeds();
  shmRingSeeds();
  shmAddressSeeds();
#if SHOAL_FUZZ_WITH_OFI
  ofiSeeds();
#endif
  std::printf("wrote %d seeds under %s\n", gWritten, gRoot.c_str());
  return 0;
}
