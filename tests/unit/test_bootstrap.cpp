// The bootstrap: in-process and TCP rendezvous, allGather and barrier correctness, and its
// failure behaviour (dead root, wrong secret, abort, lost peer, mismatched calls, descriptors).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "src/bootstrap/bootstrap.hpp"
#include "src/bootstrap/hmac.hpp"
#include "src/bootstrap/rendezvous.hpp"
#include "src/bootstrap/socket.hpp"

namespace weft::boot {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

BootstrapOptions testOptions(double timeoutSeconds = 20) {
  BootstrapOptions o;
  o.timeoutSeconds = timeoutSeconds;
  return o;
}

void runRanks(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
}

unsigned char pattern(int rank, int round, std::size_t i) {
  return static_cast<unsigned char>(rank * 131 + round * 7 + static_cast<int>(i) * 3 + 1);
}

// One allGather of rank-specific records plus a barrier; "" when correct, else what went wrong.
std::string gatherRound(Bootstrap& b, int round, std::size_t bytes) {
  const int n = b.size();
  std::vector<unsigned char> buf(static_cast<std::size_t>(n) * bytes, 0xEE);
  for (std::size_t i = 0; i < bytes; ++i) {
    buf[static_cast<std::size_t>(b.rank()) * bytes + i] = pattern(b.rank(), round, i);
  }
  if (Status st = b.allGather(buf.data(), bytes); !st.isOk()) return st.toString();
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < bytes; ++i) {
      if (buf[static_cast<std::size_t>(r) * bytes + i] != pattern(r, round, i)) {
        return "rank " + std::to_string(b.rank()) + " round " + std::to_string(round) +
               ": wrong byte " + std::to_string(i) + " of rank " + std::to_string(r);
      }
    }
  }
  if (Status st = b.barrier(); !st.isOk()) return st.toString();
  return "";
}

// Connects `n` ranks as threads; fails the test if any rank fails.
std::vector<std::unique_ptr<Bootstrap>> connectThreads(const UniqueId& id, int n,
                                                       const BootstrapOptions& options) {
  std::vector<std::unique_ptr<Bootstrap>> out(static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  runRanks(n, [&](int r) {
    auto b = connectTcp(id, r, n, options, rankStartsRoot(id, r));
    if (b) {
      out[static_cast<std::size_t>(r)] = std::move(*b);
    } else {
      errors[static_cast<std::size_t>(r)] = b.status().toString();
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
  return out;
}

int countOpenFds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// A port on `host` that nothing listens on (it was free a moment ago); 0 if none can be had.
int freePort(const std::string& host = "127.0.0.1") {
  auto address = SocketAddress::parse(host + ":1");
  if (!address) return 0;
  address->setPort(0);
  auto listener = Socket::listen(*address, false);
  if (!listener) return 0;
  auto bound = listener->localAddress();
  return bound ? bound->port() : 0;
}

// Runs first: other tests leave root threads that finish on their own schedule.
TEST(Bootstrap, NoDescriptorLeakAcrossRendezvous) {
  // One warm-up so lazily opened descriptors (sanitizer runtimes, eventfd caches) exist already.
  {
    auto id = createUniqueId(testOptions());
    ASSERT_TRUE(id.isOk()) << id.status().toString();
    auto bs = connectThreads(*id, 3, testOptions());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int before = countOpenFds();
  {
    auto id = createUniqueId(testOptions());
    ASSERT_TRUE(id.isOk()) << id.status().toString();
    auto bs = connectThreads(*id, 4, testOptions());
    runRanks(4,
             [&](int r) { EXPECT_EQ(gatherRound(*bs[static_cast<std::size_t>(r)], 0, 16), ""); });
  }
  // The root thread closes its descriptors after it has sent the table; give it a moment.
  int after = countOpenFds();
  for (int i = 0; i < 100 && after != before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    after = countOpenFds();
  }
  EXPECT_EQ(after, before);
}

TEST(Bootstrap, InProcessAllGatherAndBarrier) {
  for (int n : {1, 2, 3, 8}) {
    auto bs = makeInProcess(n, testOptions());
    ASSERT_TRUE(bs.isOk()) << bs.status().toString();
    ASSERT_EQ(bs->size(), static_cast<std::size_t>(n));
    runRanks(n, [&](int r) {
      Bootstrap& b = *(*bs)[static_cast<std::size_t>(r)];
      EXPECT_EQ(b.rank(), r);
      EXPECT_EQ(b.size(), n);
      for (int round = 0; round < 50; ++round) {
        // Sizes change between rounds: the staging buffer is resized per round.
        const std::string err = gatherRound(b, round, 1 + static_cast<std::size_t>(round % 5) * 8);
        EXPECT_EQ(err, "") << "n=" << n;
        if (!err.empty()) return;
      }
    });
  }
}

TEST(Bootstrap, InProcessRejectsBadArguments) {
  EXPECT_EQ(makeInProcess(0, testOptions()).status().code(), Code::invalidArgument);
  EXPECT_EQ(makeInProcess(2, testOptions(0)).status().code(), Code::invalidArgument);
}

TEST(Bootstrap, InProcessSizeMismatchIsAnError) {
  auto bs = makeInProcess(2, testOptions(5));
  ASSERT_TRUE(bs.isOk());
  std::vector<Status> results(2);
  runRanks(2, [&](int r) {
    std::vector<unsigned char> buf(64);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    results[static_cast<std::size_t>(r)] =
        (*bs)[static_cast<std::size_t>(r)]->allGather(buf.data(), r == 0 ? 8 : 16);
  });
  EXPECT_EQ(results[1].code(), Code::invalidUsage) << results[1].toString();
  EXPECT_FALSE(results[0].isOk());
}

TEST(Bootstrap, InProcessAbortUnblocksAWaitingRank) {
  auto bs = makeInProcess(3, testOptions(30));
  ASSERT_TRUE(bs.isOk());
  Status result;
  Clock::time_point abortedAt;
  std::thread waiter([&] {
    std::vector<unsigned char> buf(3 * 8);
    result = (*bs)[0]->allGather(buf.data(), 8);  // ranks 1 and 2 never arrive
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  abortedAt = Clock::now();
  (*bs)[0]->abort();
  waiter.join();
  EXPECT_LT(secondsSince(abortedAt), 1.0);
  EXPECT_EQ(result.code(), Code::remoteError) << result.toString();
  // Later calls, on any rank, fail at once.
  EXPECT_EQ((*bs)[1]->barrier().code(), Code::remoteError);
}

TEST(Bootstrap, InProcessTimeoutNamesTheMissingRanks) {
  auto bs = makeInProcess(3, testOptions(0.3));
  ASSERT_TRUE(bs.isOk());
  std::vector<unsigned char> buf(3);
  const auto start = Clock::now();
  Status st = (*bs)[1]->allGather(buf.data(), 1);
  EXPECT_LT(secondsSince(start), 2.0);
  EXPECT_EQ(st.code(), Code::timeout);
  EXPECT_NE(st.message().find("missing: rank 0, 2"), std::string::npos) << st.message();
}

TEST(Bootstrap, TcpThreadsAllGatherAndBarrier) {
  for (int n : {1, 2, 3, 8}) {
    auto id = createUniqueId(testOptions());
    ASSERT_TRUE(id.isOk()) << id.status().toString();
    auto bs = connectThreads(*id, n, testOptions());
    ASSERT_EQ(bs.size(), static_cast<std::size_t>(n));
    for (const auto& b : bs) ASSERT_NE(b, nullptr);
    runRanks(n, [&](int r) {
      Bootstrap& b = *bs[static_cast<std::size_t>(r)];
      EXPECT_EQ(b.rank(), r);
      EXPECT_EQ(b.size(), n);
      for (int round = 0; round < 20; ++round) {
        const std::string err = gatherRound(b, round, 1 + static_cast<std::size_t>(round % 4) * 40);
        EXPECT_EQ(err, "") << "n=" << n;
        if (!err.empty()) return;
      }
      // Empty records still synchronise.
      EXPECT_TRUE(b.allGather(nullptr, 0).isOk());
    });
  }
}

TEST(Bootstrap, TcpLargeRecordsDoNotDeadlock) {
  // 4 MiB per rank exceeds the socket buffers: sends and receives must progress together.
  constexpr int n = 3;
  auto id = createUniqueId(testOptions());
  ASSERT_TRUE(id.isOk());
  auto bs = connectThreads(*id, n, testOptions());
  runRanks(n, [&](int r) {
    EXPECT_EQ(gatherRound(*bs[static_cast<std::size_t>(r)], 1, std::size_t{4} << 20), "");
  });
}

TEST(Bootstrap, TcpOverLoopbackInterface) {
  BootstrapOptions options = testOptions();
  options.ifname = "lo";
  auto id = createUniqueId(options);
  ASSERT_TRUE(id.isOk()) << id.status().toString();
  auto root = rootAddress(*id);
  ASSERT_TRUE(root.isOk());
  EXPECT_EQ(root->rfind("127.0.0.1:", 0), 0u) << *root;
  auto bs = connectThreads(*id, 2, options);
  runRanks(2, [&](int r) { EXPECT_EQ(gatherRound(*bs[static_cast<std::size_t>(r)], 0, 8), ""); });
}

// The record each forked child contributes.
struct ChildRecord {
  int rank;
  int pid;
  char text[24];
};

int childMain(const UniqueId& id, int rank, int n) {
  auto b = connectTcp(id, rank, n, testOptions(15), false);
  if (!b) return 2;
  std::vector<ChildRecord> records(static_cast<std::size_t>(n));
  ChildRecord& mine = records[static_cast<std::size_t>(rank)];
  mine.rank = rank;
  mine.pid = static_cast<int>(::getpid());
  std::snprintf(mine.text, sizeof mine.text, "hello from %d", rank);
  for (int round = 0; round < 5; ++round) {
    if (!(*b)->allGather(records.data(), sizeof(ChildRecord)).isOk()) return 3;
    std::set<int> pids;
    for (int r = 0; r < n; ++r) {
      const ChildRecord& rec = records[static_cast<std::size_t>(r)];
      char expected[24];
      std::snprintf(expected, sizeof expected, "hello from %d", r);
      if (rec.rank != r || std::strcmp(rec.text, expected) != 0) return 4;
      pids.insert(rec.pid);
    }
    if (pids.size() != static_cast<std::size_t>(n)) return 5;
    if (!(*b)->barrier().isOk()) return 6;
  }
  return 0;
}

TEST(Bootstrap, TcpAcrossProcesses) {
  constexpr int n = 4;
  auto id = createUniqueId(testOptions());  // the root thread stays in this (parent) process
  ASSERT_TRUE(id.isOk()) << id.status().toString();
  std::vector<pid_t> children;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) ::_exit(childMain(*id, r, n));
    children.push_back(pid);
  }
  std::vector<int> exitCodes(n, -1);
  int running = n;
  const auto start = Clock::now();
  while (running > 0 && secondsSince(start) < 20) {
    for (int r = 0; r < n; ++r) {
      if (exitCodes[static_cast<std::size_t>(r)] != -1) continue;
      int status = 0;
      if (::waitpid(children[static_cast<std::size_t>(r)], &status, WNOHANG) > 0) {
        exitCodes[static_cast<std::size_t>(r)] = WIFEXITED(status) ? WEXITSTATUS(status) : 100;
        --running;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < n; ++r) {
    if (exitCodes[static_cast<std::size_t>(r)] != -1) continue;
    ::kill(children[static_cast<std::size_t>(r)], SIGKILL);  // never hang the test run
    ::waitpid(children[static_cast<std::size_t>(r)], nullptr, 0);
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(exitCodes[static_cast<std::size_t>(r)], 0) << "child rank " << r;
  }
}

TEST(Bootstrap, CommIdModeRankZeroRunsTheRoot) {
  // IPv4, IPv6 in brackets, and a host name.
  for (const std::string host : {"127.0.0.1", "[::1]", "localhost"}) {
    const int port = freePort(host);
    if (port == 0) {
      ADD_FAILURE_AT(__FILE__, __LINE__) << "no free port on " << host;
      continue;
    }
    const std::string address = host + ":" + std::to_string(port);
    SCOPED_TRACE(address);
    auto id = uniqueIdFromAddress(address);
    ASSERT_TRUE(id.isOk()) << id.status().toString();
    EXPECT_TRUE(rankStartsRoot(*id, 0));
    EXPECT_FALSE(rankStartsRoot(*id, 1));
    // Every process computes the same id from the same address.
    auto again = uniqueIdFromAddress(address);
    ASSERT_TRUE(again.isOk());
    EXPECT_EQ(std::memcmp(id->bytes, again->bytes, kUniqueIdBytes), 0);
    if (host != "localhost") {
      EXPECT_EQ(*rootAddress(*id), address);
    }

    constexpr int n = 3;
    std::vector<std::string> errors(n);
    runRanks(n, [&](int r) {
      // Rank 0 comes late: the others retry until its root listens.
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      auto b = connectTcp(*id, r, n, testOptions(), rankStartsRoot(*id, r));
      if (!b) {
        errors[static_cast<std::size_t>(r)] = b.status().toString();
        return;
      }
      errors[static_cast<std::size_t>(r)] = gatherRound(**b, 0, 12);
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
  }
}

TEST(Bootstrap, CommIdPortInUseIsAClearError) {
  auto address = SocketAddress::parse("127.0.0.1:1");
  ASSERT_TRUE(address.isOk());
  address->setPort(0);
  auto holder = Socket::listen(*address, false);  // someone else owns the port
  ASSERT_TRUE(holder.isOk());
  const std::string text = holder->localAddress()->toString();
  auto id = uniqueIdFromAddress(text);
  ASSERT_TRUE(id.isOk());
  auto b = connectTcp(*id, 0, 2, testOptions(1), true);
  EXPECT_EQ(b.status().code(), Code::systemError) << b.status().toString();
  EXPECT_NE(b.status().message().find(text), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find("address already in use"), std::string::npos)
      << b.status().message();
}

TEST(Bootstrap, StartRootOnlyForCommIdMode) {
  auto id = createUniqueId(testOptions(2));
  ASSERT_TRUE(id.isOk());
  EXPECT_FALSE(rankStartsRoot(*id, 0));
  auto b = connectTcp(*id, 0, 1, testOptions(2), true);
  EXPECT_EQ(b.status().code(), Code::invalidUsage) << b.status().toString();
  auto ok = connectTcp(*id, 0, 1, testOptions(2), false);  // the root still serves the id
  EXPECT_TRUE(ok.isOk()) << ok.status().toString();
}

TEST(Bootstrap, WrongSecretIsRefusedAndTheRendezvousCompletes) {
  auto id = createUniqueId(testOptions());
  ASSERT_TRUE(id.isOk());
  auto contents = detail::decodeId(*id);
  ASSERT_TRUE(contents.isOk());
  const SocketAddress root = contents->root;
  const Deadline deadline = Deadline::after(5);

  // A stray sending garbage, an impostor with a wrong secret, and a client that stays silent.
  auto garbage = Socket::connect(root, "the root", deadline, nullptr);
  ASSERT_TRUE(garbage.isOk()) << garbage.status().toString();
  std::vector<unsigned char> junk(detail::kProofBytes, 0x5A);
  ASSERT_TRUE(garbage->sendAll(junk.data(), junk.size(), "the root", deadline, nullptr).isOk());

  detail::Secret wrong = contents->secret;
  wrong[3] ^= 0x40;
  auto impostor = Socket::connect(root, "the root", deadline, nullptr);
  ASSERT_TRUE(impostor.isOk());
  const Status impostorResult =
      detail::clientHandshake(*impostor, wrong, {detail::HelloKind::toRoot, 0, 3, root}, "the root",
                              deadline)
          .status();

  auto silent = Socket::connect(root, "the root", deadline, nullptr);
  ASSERT_TRUE(silent.isOk());

  // A whole rank joining with a wrong-secret id is dropped at once, told why it may be.
  detail::IdContents badContents = *contents;
  badContents.secret = wrong;
  const UniqueId badId = detail::encodeId(badContents);
  const Status badResult = connectTcp(badId, 1, 3, testOptions(5), false).status();

  // The refused connections got the root's challenge and nothing more: closed without an answer.
  unsigned char challenge[detail::kChallengeBytes];
  EXPECT_TRUE(garbage->recvAll(challenge, sizeof challenge, "the root", deadline, nullptr).isOk());
  unsigned char byte = 0;
  EXPECT_EQ(garbage->recvAll(&byte, 1, "the root", deadline, nullptr).code(), Code::remoteError);
  EXPECT_EQ(impostorResult.code(), Code::remoteError) << impostorResult.toString();

  auto bs = connectThreads(*id, 3, testOptions());
  runRanks(3, [&](int r) { EXPECT_EQ(gatherRound(*bs[static_cast<std::size_t>(r)], 0, 8), ""); });
  EXPECT_EQ(badResult.code(), Code::remoteError) << badResult.toString();
  EXPECT_NE(badResult.message().find("refused this rank's proof"), std::string::npos)
      << badResult.message();
}

// WEFT_COMM_ID with a secret: a stranger who knows the address and the wire format (and so the
// address-derived secret of an unauthenticated rendezvous) joins neither as a missing rank nor
// as a spare one, and learns nothing but a challenge nonce; the real ranks all succeed.
TEST(Bootstrap, AStrangerWhoKnowsTheAddressCannotJoin) {
  const int port = freePort();
  ASSERT_NE(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto id = uniqueIdFromAddress(address, "correct horse battery staple");
  auto guessed = uniqueIdFromAddress(address);  // what the address alone gives
  auto other = uniqueIdFromAddress(address, "a wrong guess");
  ASSERT_TRUE(id.isOk() && guessed.isOk() && other.isOk());
  auto contents = detail::decodeId(*id);
  ASSERT_TRUE(contents.isOk());
  EXPECT_FALSE(detail::sameSecret(contents->secret, detail::decodeId(*guessed)->secret));

  constexpr int n = 3;
  std::vector<std::unique_ptr<Bootstrap>> real(n);
  std::vector<std::string> errors(n);
  std::vector<Status> strangers(3);
  std::vector<unsigned char> learned;
  std::thread root([&] {  // rank 0 runs the root at the address
    auto b = connectTcp(*id, 0, n, testOptions(10), true);
    if (b)
      real[0] = std::move(*b);
    else
      errors[0] = b.status().toString();
  });
  // Strangers come first: as rank 1 (the address-derived secret), as a spare rank 3 of 4, with a
  // wrong secret, and by hand with a made-up proof, reading whatever the root sends.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  strangers[0] = connectTcp(*guessed, 1, n, testOptions(3), false).status();
  strangers[1] = connectTcp(*guessed, 3, n + 1, testOptions(3), false).status();
  strangers[2] = connectTcp(*other, 2, n, testOptions(3), false).status();
  {
    const Deadline deadline = Deadline::after(3);
    auto s = Socket::connect(contents->root, "the root", deadline, nullptr);
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    std::vector<unsigned char> proof(detail::kProofBytes, 0);
    std::memcpy(proof.data(), "WEFTPROF", 8);
    proof[11] = 2;  // version 2, big-endian or not: the HMAC is wrong anyway
    proof[15] = 1;
    (void)s->sendAll(proof.data(), proof.size(), "the root", deadline, nullptr);
    unsigned char byte = 0;
    while (s->recvAll(&byte, 1, "the root", deadline, nullptr).isOk()) learned.push_back(byte);
  }
  std::thread rest([&] {
    runRanks(n - 1, [&](int i) {
      const int r = i + 1;
      auto b = connectTcp(*id, r, n, testOptions(10), false);
      if (b)
        real[static_cast<std::size_t>(r)] = std::move(*b);
      else
        errors[static_cast<std::size_t>(r)] = b.status().toString();
    });
  });
  root.join();
  rest.join();
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
  runRanks(n, [&](int r) { EXPECT_EQ(gatherRound(*real[static_cast<std::size_t>(r)], 0, 8), ""); });
  for (const Status& st : strangers) {
    EXPECT_EQ(st.code(), Code::remoteError) << st.toString();
    EXPECT_NE(st.message().find("refused this rank's proof"), std::string::npos) << st.message();
  }
  EXPECT_EQ(learned.size(), detail::kChallengeBytes) << "the stranger was told more than a nonce";
}

// A record altered on its way round the ring fails its origin's HMAC at the next rank, which
// names the record's origin and the rank that forwarded it.
TEST(Bootstrap, ARecordAlteredOnTheRingFailsItsHmac) {
  auto id = createUniqueId(testOptions());
  ASSERT_TRUE(id.isOk());
  constexpr int n = 3;
  std::vector<std::unique_ptr<Bootstrap>> bs(n);
  runRanks(n, [&](int r) {
    BootstrapOptions o = testOptions(10);
    o.testTamperForwarded = r == 1;  // rank 1 flips a bit of every record it passes on
    auto b = connectTcp(*id, r, n, o, false);
    ASSERT_TRUE(b.isOk()) << b.status().toString();
    bs[static_cast<std::size_t>(r)] = std::move(*b);
  });
  std::vector<std::string> results(n);
  runRanks(n, [&](int r) {
    const auto R = static_cast<std::size_t>(r);
    results[R] = gatherRound(*bs[R], 0, 24);
  });
  EXPECT_NE(results[2].find("rank 0's record, forwarded by rank 1"), std::string::npos)
      << results[2];
  EXPECT_NE(results[2].find("fails its HMAC"), std::string::npos) << results[2];
}

// SHA-256 and HMAC-SHA256 against FIPS 180-4's and RFC 4231's published vectors.
TEST(Bootstrap, Sha256AndHmacMatchTheirStandardVectors) {
  auto hex = [](const detail::Digest& d) {
    std::string out;
    char two[3];
    for (unsigned char c : d) {
      std::snprintf(two, sizeof two, "%02x", c);
      out += two;
    }
    return out;
  };
  EXPECT_EQ(hex(detail::sha256("abc", 3)),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(hex(detail::sha256(two.data(), two.size())),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::vector<unsigned char> key1(20, 0x0b);
  EXPECT_EQ(hex(detail::hmacSha256(key1.data(), key1.size(), {{"Hi There", 8}})),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(detail::hmacSha256("Jefe", 4, {{"what do ya want ", 16}, {"for nothing?", 12}})),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  const std::vector<unsigned char> key6(131, 0xaa);  // a key longer than a block is hashed first
  const std::string msg6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  EXPECT_EQ(hex(detail::hmacSha256(key6.data(), key6.size(), {{msg6.data(), msg6.size()}})),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Bootstrap, DeadRootAddressTimesOutNamingIt) {
  const int port = freePort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto id = uniqueIdFromAddress(address);
  ASSERT_TRUE(id.isOk());
  const auto start = Clock::now();
  auto b = connectTcp(*id, 1, 2, testOptions(1), false);
  const double elapsed = secondsSince(start);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::timeout);
  EXPECT_NE(b.status().message().find(address), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find("connection refused"), std::string::npos)
      << b.status().message();
  EXPECT_GE(elapsed, 0.9);
  EXPECT_LT(elapsed, 2.0);
}

TEST(Bootstrap, AbortUnblocksAllGatherAndTellsTheNeighbours) {
  constexpr int n = 3;
  auto id = createUniqueId(testOptions());
  ASSERT_TRUE(id.isOk());
  auto bs = connectThreads(*id, n, testOptions(30));
  Status result;
  std::thread waiter([&] {
    std::vector<unsigned char> buf(n * 8);
    result = bs[0]->allGather(buf.data(), 8);  // ranks 1 and 2 never call
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto abortedAt = Clock::now();
  bs[0]->abort();
  waiter.join();
  EXPECT_LT(secondsSince(abortedAt), 1.0);
  EXPECT_EQ(result.code(), Code::remoteError) << result.toString();

  auto start = Clock::now();
  EXPECT_EQ(bs[0]->barrier().code(), Code::remoteError);  // later calls fail at once
  // Rank 1 joins the same allGather; rank 0 left mid-way: rank 1 fails at once, naming rank 0.
  std::vector<unsigned char> buf(n * 8);
  Status neighbour = bs[1]->allGather(buf.data(), 8);
  EXPECT_LT(secondsSince(start), 1.0);
  EXPECT_EQ(neighbour.code(), Code::remoteError) << neighbour.toString();
  EXPECT_NE(neighbour.message().find("rank 0"), std::string::npos) << neighbour.message();
}

TEST(Bootstrap, LostPeerIsARemoteErrorNamingIt) {
  auto id = createUniqueId(testOptions());
  ASSERT_TRUE(id.isOk());
  auto bs = connectThreads(*id, 2, testOptions(10));
  bs[1].reset();  // rank 1 exits
  std::vector<unsigned char> buf(16);
  const auto start = Clock::now();
  Status st = bs[0]->allGather(buf.data(), 8);
  EXPECT_LT(secondsSince(start), 2.0);
  EXPECT_EQ(st.code(), Code::remoteError) << st.toString();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
}

TEST(Bootstrap, TcpSizeMismatchIsAnError) {
  auto id = createUniqueId(testOptions());
  ASSERT_TRUE(id.isOk());
  auto bs = connectThreads(*id, 2, testOptions(10));
  std::vector<Status> results(2);
  runRanks(2, [&](int r) {
    std::vector<unsigned char> buf(64);
    results[static_cast<std::size_t>(r)] =
        bs[static_cast<std::size_t>(r)]->allGather(buf.data(), r == 0 ? 8 : 16);
  });
  for (const Status& st : results) {
    EXPECT_EQ(st.code(), Code::invalidUsage) << st.toString();
    EXPECT_NE(st.message().find("bytes per rank"), std::string::npos) << st.message();
  }
}

TEST(Bootstrap, MismatchedNranksIsAnErrorNamingTheRank) {
  auto id = createUniqueId(testOptions(3));
  ASSERT_TRUE(id.isOk());
  std::vector<Status> results(2);
  runRanks(2, [&](int r) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    results[static_cast<std::size_t>(r)] =
        connectTcp(*id, r, r == 0 ? 2 : 3, testOptions(3), false).status();
  });
  for (const Status& st : results) {
    EXPECT_EQ(st.code(), Code::invalidUsage) << st.toString();
    EXPECT_NE(st.message().find("rank 1 joined with nranks=3"), std::string::npos) << st.message();
  }
}

TEST(Bootstrap, DuplicateRankIsAnErrorNamingIt) {
  auto id = createUniqueId(testOptions(2));
  ASSERT_TRUE(id.isOk());
  std::vector<Status> results(2);
  runRanks(2, [&](int i) {
    if (i == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    results[static_cast<std::size_t>(i)] = connectTcp(*id, 0, 2, testOptions(2), false).status();
  });
  for (const Status& st : results) {
    EXPECT_EQ(st.code(), Code::invalidUsage) << st.toString();
    EXPECT_NE(st.message().find("rank 0 joined twice"), std::string::npos) << st.message();
  }
}

TEST(Bootstrap, RejectsBadArgumentsAndIds) {
  auto id = createUniqueId(testOptions(1));
  ASSERT_TRUE(id.isOk());
  EXPECT_EQ(connectTcp(*id, 2, 2, testOptions(), false).status().code(), Code::invalidArgument);
  EXPECT_EQ(connectTcp(*id, 0, 0, testOptions(), false).status().code(), Code::invalidArgument);
  EXPECT_EQ(connectTcp(*id, 0, 1, testOptions(-1), false).status().code(), Code::invalidArgument);
  UniqueId garbage{};
  std::memset(garbage.bytes, 7, sizeof garbage.bytes);
  auto b = connectTcp(garbage, 0, 1, testOptions(), false);
  EXPECT_EQ(b.status().code(), Code::invalidArgument);
  EXPECT_NE(b.status().message().find("not a weft unique id"), std::string::npos);
  EXPECT_FALSE(rankStartsRoot(garbage, 0));
  EXPECT_EQ(createUniqueId(testOptions(0)).status().code(), Code::invalidArgument);
  BootstrapOptions noSuch = testOptions();
  noSuch.ifname = "=nosuchif9";
  auto missing = createUniqueId(noSuch);
  EXPECT_EQ(missing.status().code(), Code::invalidArgument);
  EXPECT_NE(missing.status().message().find("WEFT_SOCKET_IFNAME"), std::string::npos);
}

TEST(Bootstrap, ParsesAndPrintsAddresses) {
  auto v4 = SocketAddress::parse("10.1.2.3:29500");
  ASSERT_TRUE(v4.isOk());
  EXPECT_EQ(v4->toString(), "10.1.2.3:29500");
  auto v6 = SocketAddress::parse("[::1]:29500");
  ASSERT_TRUE(v6.isOk()) << v6.status().toString();
  EXPECT_EQ(v6->toString(), "[::1]:29500");
  auto named = SocketAddress::parse("localhost:80");
  ASSERT_TRUE(named.isOk()) << named.status().toString();
  EXPECT_EQ(named->port(), 80);

  unsigned char bytes[SocketAddress::kWireBytes];
  for (const SocketAddress& a : {*v4, *v6}) {
    a.encode(bytes);
    EXPECT_EQ(SocketAddress::decode(bytes).toString(), a.toString());
  }
  for (const char* bad :
       {"10.1.2.3", "::1:80", "10.1.2.3:0", "10.1.2.3:65536", ":80", "[::1]80", "10.1.2.3:8x"}) {
    EXPECT_EQ(SocketAddress::parse(bad).status().code(), Code::invalidArgument) << bad;
  }
  EXPECT_EQ(uniqueIdFromAddress("nohostport").status().code(), Code::invalidArgument);
}

TEST(Bootstrap, PicksInterfacesLikeNccl) {
  auto lo = interfaceAddress("lo");
  ASSERT_TRUE(lo.isOk()) << lo.status().toString();
  EXPECT_EQ(lo->toString(), "127.0.0.1:0");
  auto exact = interfaceAddress("=lo");
  ASSERT_TRUE(exact.isOk());
  EXPECT_EQ(exact->toString(), "127.0.0.1:0");
  auto any = interfaceAddress("");
  ASSERT_TRUE(any.isOk()) << any.status().toString();
  // Excluding loopback gives another interface, or a clear error on a loopback-only host.
  auto notLo = interfaceAddress("^lo");
  if (notLo.isOk()) {
    EXPECT_NE(notLo->toString(), "127.0.0.1:0");
  } else {
    EXPECT_EQ(notLo.status().code(), Code::invalidArgument);
  }
  EXPECT_EQ(interfaceAddress("=l").status().code(), Code::invalidArgument);  // exact, not prefix
  // The interface's name goes to UCX (NET_DEVICES) with the address.
  auto named = chooseInterface("l");
  ASSERT_TRUE(named.isOk());
  EXPECT_EQ(named->name, "lo");
  EXPECT_EQ(named->address.toString(), "127.0.0.1:0");
}

}  // namespace
}  // namespace weft::boot
