// collie's rendezvous store: what a job does with it, the job token, and a server that keeps
// serving (with bounded memory) while strangers send it garbage, huge length prefixes and
// frames they never finish.
#include "runtime/tcp_store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "collie/error.h"
#include "expect.h"
#include "soak.h"

namespace collie {
namespace {

using namespace std::chrono_literals;

// A raw TCP connection to 127.0.0.1:port, or -1.
int connectRaw(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` (it reads EOF or an error within a second).
bool closedByServer(int fd) {
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char byte;
  return ::recv(fd, &byte, 1, 0) <= 0 && errno != EAGAIN;
}

std::string frame(const std::string& payload) {
  std::string out(4, '\0');
  const uint32_t n = static_cast<uint32_t>(payload.size());
  std::memcpy(&out[0], &n, 4);
  return out + payload;
}

std::string str(const std::string& s) {
  std::string out(4, '\0');
  const uint32_t n = static_cast<uint32_t>(s.size());
  std::memcpy(&out[0], &n, 4);
  return out + s;
}

TEST(Store, SetGetAddCheckAndWait) {
  TcpStore server("127.0.0.1", 0, true, 5s);
  TcpStore client("127.0.0.1", server.port(), false, 5s);
  server.setString("a", "alpha");
  EXPECT_EQ(client.getString("a"), "alpha");
  EXPECT_EQ(client.add("n", 2), 2);
  EXPECT_EQ(server.add("n", 3), 5);
  EXPECT_EQ(client.add("n", 0), 5);
  EXPECT_TRUE(client.check({"a", "n"}));
  EXPECT_FALSE(client.check({"a", "missing"}));
  std::thread late([&] {
    std::this_thread::sleep_for(200ms);
    server.setString("late", "x");
  });
  client.wait({"late"}, 5s);  // returns once it is set
  late.join();
  EXPECT_EQ(client.getString("late"), "x");
  EXPECT_TRUE(testing::throwsWith<CommError>([&] { client.wait({"never"}, 300ms); },
                                             {"waited 300 ms for never"}))
      << "waited for a key nobody sets";
  std::vector<uint8_t> big(1 << 20, 7);
  client.set("big", big);
  EXPECT_EQ(server.get("big"), big);
}

// Reads one reply frame from `fd` within `limit`; "" when none came.
std::string readReply(int fd, std::chrono::milliseconds limit) {
  const timeval tv{static_cast<time_t>(limit.count() / 1000),
                   static_cast<suseconds_t>(limit.count() % 1000 * 1000)};
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) return "";
  uint32_t length = 0;
  if (::recv(fd, &length, 4, MSG_WAITALL) != 4 || length > 1024) return "";
  std::string payload(length, '\0');
  if (::recv(fd, payload.data(), length, MSG_WAITALL) != static_cast<ssize_t>(length)) return "";
  return payload;
}

std::string u32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

// A WAIT is held by the server, not polled for: it is answered when another connection sets
// its key, a request sent behind it is answered after it, in order, and a WAIT for a key
// nobody sets is answered "not yet" once its slice is over.
TEST(Store, AWaitIsHeldUntilItsKeyIsSetAndWhatFollowsItIsAnsweredAfter) {
  TcpStore server("127.0.0.1", 0, true, 5s);
  const int fd = connectRaw(server.port());
  ASSERT_GE(fd, 0);
  const std::string hello = frame(std::string(1, '\1') + str(""));
  ASSERT_EQ(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(hello.size()));
  ASSERT_EQ(readReply(fd, 1000ms), std::string("\0\1", 2)) << "ok, and WAIT is held";
  const std::string wait = frame(std::string(1, '\6') + u32(1) + str("k") + u32(5000));
  const std::string check = frame(std::string(1, '\5') + u32(1) + str("k"));
  const std::string both = wait + check;
  ASSERT_EQ(::send(fd, both.data(), both.size(), MSG_NOSIGNAL), static_cast<ssize_t>(both.size()));
  EXPECT_EQ(readReply(fd, 300ms), "") << "answered before the key was set";
  server.setString("k", "v");
  EXPECT_EQ(readReply(fd, 1000ms), std::string("\0\1", 2)) << "the WAIT";
  EXPECT_EQ(readReply(fd, 1000ms), std::string("\0\1", 2)) << "the CHECK behind it";
  const auto start = std::chrono::steady_clock::now();
  const std::string never = frame(std::string(1, '\6') + u32(1) + str("never") + u32(200));
  ASSERT_EQ(::send(fd, never.data(), never.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(never.size()));
  EXPECT_EQ(readReply(fd, 2000ms), std::string("\0\0", 2));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 190ms) << "not held for its slice";
  // A WAIT naming more keys than any rendezvous does is refused, not held.
  const std::string many = frame(std::string(1, '\6') + u32(70000) + u32(100));
  ASSERT_EQ(::send(fd, many.data(), many.size(), MSG_NOSIGNAL), static_cast<ssize_t>(many.size()));
  const std::string refused = readReply(fd, 1000ms);
  ASSERT_FALSE(refused.empty());
  EXPECT_EQ(refused[0], '\1');
  EXPECT_TRUE(testing::contains(refused, {"a wait for 70000 keys"}));
  ::close(fd);
  // Another thread of a client that waits gets its own request through between slices,
  // within a slice or two, not when the wait ends.
  TcpStore client("127.0.0.1", server.port(), false, 5s);
  std::string failed;
  std::thread waiter([&] {
    try {
      client.wait({"later"}, 5s);
    } catch (const std::exception& e) {
      failed = e.what();
    }
  });
  std::this_thread::sleep_for(300ms);
  const auto before_set = std::chrono::steady_clock::now();
  client.setString("later", "x");  // through the waiting client's own connection
  EXPECT_LT(std::chrono::steady_clock::now() - before_set, 1s) << "the set waited out the wait";
  waiter.join();
  EXPECT_EQ(failed, "");
  EXPECT_EQ(server.getString("later"), "x");
}

// A counter's key and digits count against the store's byte limit as a set's do: once the
// store is full, an add that would make a new key is refused, and an add to a key that holds
// an empty value counts the key once.
TEST(Store, AddsCountAgainstTheStoresByteLimit) {
  TcpStore server("127.0.0.1", 0, true, 5s);
  TcpStore client("127.0.0.1", server.port(), false, 5s);
  // Keys of almost a frame (4 MiB) each, made by add alone: 64 of them pass 256 MiB.
  const size_t key_bytes = StoreLimits::kMaxFrame - 64;
  size_t made = 0;
  std::string refusal;
  for (int i = 0; i < 80 && refusal.empty(); ++i) {
    std::string key(key_bytes, 'k');
    key.replace(0, 2, std::to_string(10 + i));
    try {
      EXPECT_EQ(client.add(key, 1), 1);
      ++made;
    } catch (const CommError& e) {
      refusal = e.what();
    }
  }
  EXPECT_EQ(made, StoreLimits::kMaxStoredBytes / (key_bytes + 1)) << "adds made past the limit";
  EXPECT_TRUE(testing::contains(
      refusal, {"the store is full", std::to_string(StoreLimits::kMaxStoredBytes) + " bytes"}));
  EXPECT_LT(refusal.size(), 1000u) << "the refusal quotes the 4 MiB key";
  // Full: a set is refused too, so the adds were counted.
  EXPECT_THROW(client.setString(std::string(4096, 's'), "x"), CommError);
}

TEST(Store, AnEmptyValueCountsItsKeyOnceWhenAnAddTakesIt) {
  TcpStore server("127.0.0.1", 0, true, 5s);
  TcpStore client("127.0.0.1", server.port(), false, 5s);
  // Fill to 1 KiB under the limit, leaving room for one 600-byte key, counted once.
  const std::string key(600, 'e');
  client.setString(key, "");
  const size_t frame_value = StoreLimits::kMaxFrame - 64;
  size_t stored = key.size();
  for (int i = 0; stored + 10 + frame_value <= StoreLimits::kMaxStoredBytes - 1024; ++i) {
    client.setString(fmt::format("{:010}", i), std::string(frame_value, 'v'));
    stored += 10 + frame_value;
  }
  const size_t room = StoreLimits::kMaxStoredBytes - stored;
  client.setString("pad", std::string(room - 3 - 1 - 200, 'p'));  // 200 bytes and a digit left
  // The add turns "" into "1": one byte more. Counting the key again would pass the limit.
  EXPECT_EQ(client.add(key, 1), 1);
  client.setString(std::string(100, 'x'), std::string(90, 'y'));  // 190 of the 200 bytes
  EXPECT_THROW(client.setString("more", std::string(100, 'z')), CommError);
}

TEST(Store, AnAddThatWouldOverflowIsRefusedAndChangesNothing) {
  TcpStore server("127.0.0.1", 0, true, 5s);
  TcpStore client("127.0.0.1", server.port(), false, 5s);
  const int64_t top = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(client.add("n", top), top);
  EXPECT_TRUE(testing::throwsWith<CommError>([&] { client.add("n", 1); }, {"overflow"}))
      << "an add past 2^63-1 succeeded";
  EXPECT_EQ(client.add("n", 0), top);
  EXPECT_EQ(client.add("m", std::numeric_limits<int64_t>::min()),
            std::numeric_limits<int64_t>::min());
  EXPECT_THROW(client.add("m", -1), CommError);
  // A value too large for 64 bits is not an integer this store can add to.
  client.setString("huge", "99999999999999999999");
  EXPECT_THROW(client.add("huge", 1), CommError);
  EXPECT_EQ(client.getString("huge"), "99999999999999999999");
}

TEST(Store, AnAddressOtherHostsReachNeedsAToken) {
  EXPECT_TRUE(testing::throwsWith<ConfigError>([&] { TcpStore("10.255.255.1", 0, true, 1s); },
                                               {"which other hosts reach, without a job token"}))
      << "a store listened beyond the loopback without a token";
  EXPECT_TRUE(isLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(isLoopbackHost("127.3.2.1"));
  EXPECT_TRUE(isLoopbackHost("localhost"));
  EXPECT_FALSE(isLoopbackHost("198.18.0.1"));
}

TEST(Store, WithoutTheTokenAClientCanNeitherReadNorWrite) {
  TcpStore server("127.0.0.1", 0, true, 5s, "s3cret");
  server.setString("job/key", "private");
  for (const std::string token : {"", "wrong", "s3cre", "s3cret!"}) {
    EXPECT_TRUE(testing::throwsWith<CommError>(
        [&] { TcpStore intruder("127.0.0.1", server.port(), false, 2s, token); },
        {"refused this rank"}))
        << "token '" << token << "' was let in";
  }
  // Raw requests without the greeting: the server hangs up and nothing changes.
  const int fd = connectRaw(server.port());
  ASSERT_GE(fd, 0);
  const std::string set = frame(std::string(1, '\2') + str("job/key") + str("overwritten"));
  ASSERT_EQ(::send(fd, set.data(), set.size(), MSG_NOSIGNAL), static_cast<ssize_t>(set.size()));
  EXPECT_TRUE(closedByServer(fd));
  ::close(fd);
  const int reader = connectRaw(server.port());
  const std::string get = frame(std::string(1, '\3') + str("job/key"));
  ::send(reader, get.data(), get.size(), MSG_NOSIGNAL);
  EXPECT_TRUE(closedByServer(reader));
  ::close(reader);
  TcpStore member("127.0.0.1", server.port(), false, 2s, "s3cret");
  EXPECT_EQ(member.getString("job/key"), "private");
}

// Random bytes, huge length prefixes and frames left unfinished on many connections: the
// server drops what it must, keeps serving the job, and holds little memory for strangers.
TEST(Store, ServesTheJobWhileStrangersSendGarbage) {
  TcpStore server("127.0.0.1", 0, true, 5s, "token");
  TcpStore member("127.0.0.1", server.port(), false, 5s, "token");
  member.setString("before", "1");
  const auto before = testing::usageNow();
  std::mt19937_64 rng(11);
  std::vector<int> open;
  for (int i = 0; i < 3000; ++i) {
    const int fd = connectRaw(server.port());
    if (fd < 0) continue;
    std::string bytes;
    switch (i % 4) {
      case 0:  // noise
        for (int k = 0; k < 200; ++k) bytes += static_cast<char>(rng());
        break;
      case 1: {  // a length prefix of megabytes or gigabytes, and 256 KiB of its frame
        const uint32_t huge =
            i % 8 == 1 ? (2u << 20) : 0xFFFFFFF0u - static_cast<uint32_t>(rng() % 1000);
        bytes.assign(reinterpret_cast<const char*>(&huge), 4);
        bytes += std::string(256 << 10, 'x');
        break;
      }
      case 2:  // a greeting cut short, the connection kept open
        bytes = frame(std::string(1, '\1') + str("token")).substr(0, 1 + rng() % 9);
        break;
      default:  // a greeting with the wrong token, then a request
        bytes = frame(std::string(1, '\1') + str("nope")) +
                frame(std::string(1, '\2') + str("before") + str("2"));
        break;
    }
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if ((i % 4 == 1 || i % 4 == 2) && open.size() < 400) {
      open.push_back(fd);  // left hanging: a server that buffered them would hold ~50 MiB
    } else {
      ::close(fd);
    }
    if (i % 500 == 0) {
      EXPECT_EQ(member.add("alive", 1), i / 500 + 1);
    }
  }
  EXPECT_EQ(member.getString("before"), "1");
  const auto during = testing::usageNow();
  EXPECT_LT(during.rss_kb - before.rss_kb, 32 * 1024) << "the server held on to garbage";
  for (int fd : open) ::close(fd);
  EXPECT_EQ(member.add("alive", 0), 6);
  // The server closes its ends as it reads their EOFs (a loaded machine may take a moment).
  auto after = testing::usageNow();
  for (int i = 0; i < 100 && after.fds != before.fds; ++i) {
    std::this_thread::sleep_for(50ms);
    after = testing::usageNow();
  }
  EXPECT_EQ(after.fds, before.fds) << "the server kept strangers' sockets";
}

// Strangers that connect and never greet cannot keep the job out: when every connection is
// taken, the oldest that has not greeted makes room.
TEST(Store, StrangersHoldingEveryConnectionDoNotKeepTheJobOut) {
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = std::max<rlim_t>(files.rlim_cur, 8192);
  if (files.rlim_max < files.rlim_cur) files.rlim_max = files.rlim_cur;
  if (::setrlimit(RLIMIT_NOFILE, &files) != 0) GTEST_SKIP() << "cannot open 2,100 descriptors";
  TcpStore server("127.0.0.1", 0, true, 5s, "token");
  std::vector<int> strangers;
  for (size_t i = 0; i < StoreLimits::kMaxConnections + 20; ++i) {
    const int fd = connectRaw(server.port());
    ASSERT_GE(fd, 0);
    strangers.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);  // the server has accepted them all
  TcpStore member("127.0.0.1", server.port(), false, 5s, "token");
  member.setString("k", "v");
  EXPECT_EQ(server.getString("k"), "v");
  for (int fd : strangers) ::close(fd);
}

}  // namespace
}  // namespace collie
