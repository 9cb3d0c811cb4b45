// TCP lanes (src/transport/tcp_lanes.hpp) between two ranks on loopback: messages from buffer to
// buffer both ways at once, larger than the sockets hold; a header that names another length or
// call; a peer that goes away; and a stranger who does not know the listener's token.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "src/bootstrap/rendezvous.hpp"
#include "src/transport/tcp_lanes.hpp"

namespace weft::transport {
namespace {

using Read = TcpLane::Read;

TcpLaneGeometry geometry(int rank, int channels = 2) {
  TcpLaneGeometry g;
  g.nranks = 2;
  g.rank = rank;
  g.channels = channels;
  g.bindTo = *boot::SocketAddress::parse("127.0.0.1:1");  // the lanes pick their port
  g.mode = 2;
  g.timeoutSeconds = 20;
  return g;
}

std::unique_ptr<TcpLanes> make(const TcpLaneGeometry& g) {
  auto lanes = TcpLanes::create(g);
  EXPECT_TRUE(lanes.isOk()) << lanes.status().message();
  return std::move(lanes).value();
}

// Two ranks' lanes, connected.
struct Pair {
  std::unique_ptr<TcpLanes> a, b;
  explicit Pair(int channels = 2) {
    a = make(geometry(0, channels));
    b = make(geometry(1, channels));
    const std::vector<std::vector<std::byte>> records = {a->record(), b->record()};
    Status sa, sb;
    std::thread t([&] { sb = b->connect(records, {true, false}); });
    sa = a->connect(records, {false, true});
    t.join();
    EXPECT_TRUE(sa.isOk()) << sa.message();
    EXPECT_TRUE(sb.isOk()) << sb.message();
  }
};

// Sends `out` on `from` while reading `in` on `to`, both lanes pumped, until both are done.
Read exchange(TcpLane* from, const std::vector<std::byte>& out, TcpLane* to,
              std::vector<std::byte>& in, std::uint32_t sent = 7, std::uint32_t expected = 7) {
  from->post(out.data(), out.size(), sent);
  for (int i = 0; i < 10'000'000; ++i) {
    from->pump();
    const Read r = to->read(in.data(), in.size(), expected);
    if (r != Read::more) {
      while (!from->pump() && from->error().empty()) {
      }
      return r;
    }
  }
  return Read::more;
}

std::vector<std::byte> randomBytes(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::mt19937 g(seed);
  for (auto& x : v) x = static_cast<std::byte>(g());
  return v;
}

TEST(TcpLanes, MessagesGoBufferToBufferBothWaysAtOnce) {
  Pair p;
  for (int c = 0; c < 2; ++c) {
    TcpLane* ab = p.a->lane(c, 1);
    TcpLane* ba = p.b->lane(c, 0);
    ASSERT_NE(ab, nullptr);
    ASSERT_NE(ba, nullptr);
    EXPECT_EQ(p.a->lane(c, 0), nullptr);
    // 16 MB each way, beyond what either socket buffers: both sides must pump while they read.
    for (std::size_t bytes : {std::size_t{1}, std::size_t{4096}, std::size_t{16} << 20}) {
      const auto x = randomBytes(bytes, 1 + c), y = randomBytes(bytes, 2 + c);
      std::vector<std::byte> gotX(bytes, std::byte{0xee}), gotY(bytes, std::byte{0xee});
      ab->post(x.data(), x.size(), 9);
      ba->post(y.data(), y.size(), 9);
      Read rx = Read::more, ry = Read::more;
      while (rx == Read::more || ry == Read::more) {
        ab->pump();
        ba->pump();
        if (rx == Read::more) rx = ba->read(gotX.data(), bytes, 9);
        if (ry == Read::more) ry = ab->read(gotY.data(), bytes, 9);
      }
      ASSERT_EQ(rx, Read::done);
      ASSERT_EQ(ry, Read::done);
      EXPECT_TRUE(ab->pump());
      EXPECT_TRUE(ba->pump());
      EXPECT_EQ(gotX, x) << bytes;
      EXPECT_EQ(gotY, y) << bytes;
    }
  }
}

TEST(TcpLanes, AnotherLengthOrCallIsAMismatchThatReadsNothing) {
  Pair p(1);
  TcpLane* ab = p.a->lane(0, 1);
  TcpLane* ba = p.b->lane(0, 0);
  const auto x = randomBytes(1000, 3);
  std::vector<std::byte> in(999, std::byte{0x5a});
  EXPECT_EQ(exchange(ab, x, ba, in), Read::mismatch);
  EXPECT_EQ(ba->lengthSeen(), 1000u);
  EXPECT_EQ(in, std::vector<std::byte>(999, std::byte{0x5a}));

  Pair q(1);
  std::vector<std::byte> same(1000, std::byte{0x5a});
  EXPECT_EQ(exchange(q.a->lane(0, 1), x, q.b->lane(0, 0), same, 11, 12), Read::mismatch);
  EXPECT_EQ(q.b->lane(0, 0)->signatureSeen(), 11u);
  EXPECT_EQ(same, std::vector<std::byte>(1000, std::byte{0x5a}));
  // Unchecked calls (signature 0 on either side) compare lengths only.
  Pair r(1);
  EXPECT_EQ(exchange(r.a->lane(0, 1), x, r.b->lane(0, 0), same, 0, 12), Read::done);
  EXPECT_EQ(same, x);
}

TEST(TcpLanes, APeerThatGoesAwayFailsTheRead) {
  Pair p(1);
  TcpLane* ba = p.b->lane(0, 0);
  p.a.reset();
  std::vector<std::byte> in(64);
  Read r = Read::more;
  for (int i = 0; i < 1'000'000 && r == Read::more; ++i) r = ba->read(in.data(), in.size(), 1);
  EXPECT_EQ(r, Read::failed);
  EXPECT_EQ(ba->error(), "the connection was closed");
}

TEST(TcpLanes, AStrangerWithoutTheTokenIsDroppedAndTheLanesStillConnect) {
  auto a = make(geometry(0, 1));
  auto b = make(geometry(1, 1));
  std::vector<std::vector<std::byte>> records = {a->record(), b->record()};
  // A stranger who read rank 1's address but guesses its token.
  const auto address =
      boot::SocketAddress::decode(reinterpret_cast<const unsigned char*>(b->record().data()));
  const auto deadline = boot::Deadline::after(10);
  Status sb;
  std::thread t([&] { sb = b->connect(records, {true, false}); });
  auto s = boot::Socket::connect(address, "rank 1", deadline, nullptr);
  ASSERT_TRUE(s.isOk());
  boot::detail::Secret guess{};
  const boot::detail::Hello hello{boot::detail::HelloKind::lane, 0, 2, {}};
  auto h = boot::detail::clientHandshake(*s, guess, hello, "rank 1", deadline);
  EXPECT_FALSE(h.isOk());
  EXPECT_NE(h.status().message().find("refused"), std::string::npos) << h.status().message();
  const Status sa = a->connect(records, {false, true});
  t.join();
  ASSERT_TRUE(sa.isOk()) << sa.message();
  ASSERT_TRUE(sb.isOk()) << sb.message();
  const auto x = randomBytes(100, 4);
  std::vector<std::byte> in(100);
  EXPECT_EQ(exchange(a->lane(0, 1), x, b->lane(0, 0), in), Read::done);
  EXPECT_EQ(in, x);
}

TEST(TcpLanes, BothEndsAgreeWhereLanesRun) {
  auto one = make(geometry(0));
  TcpLaneGeometry g = geometry(1);
  g.mode = 1;
  auto hostsOnly = make(g);
  const std::vector<std::byte> none;
  // Mode 2 on both: on one host too; mode 1 on either: only across hosts; no record: never.
  EXPECT_TRUE(TcpLanes::between(one->record(), one->record(), true));
  EXPECT_FALSE(TcpLanes::between(one->record(), hostsOnly->record(), true));
  EXPECT_FALSE(TcpLanes::between(hostsOnly->record(), one->record(), true));
  EXPECT_TRUE(TcpLanes::between(one->record(), hostsOnly->record(), false));
  EXPECT_TRUE(TcpLanes::between(hostsOnly->record(), one->record(), false));
  EXPECT_FALSE(TcpLanes::between(none, one->record(), false));
  EXPECT_FALSE(TcpLanes::between(one->record(), none, false));
}

}  // namespace
}  // namespace weft::transport
