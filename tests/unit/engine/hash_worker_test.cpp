#define BOOST_TEST_MODULE engine_hash_worker
#include "engine/hash_worker.hpp"

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/sha256.hpp"

using namespace cordon;
using namespace cordon::engine;

namespace {

std::string random_bytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) {
    c = static_cast<char>(rng());
  }
  return s;
}

std::string hex(const Sha256::Digest& d) { return Sha256::hex(d); }

}  // namespace

// The engine's use: one feeder interleaves many streams with chunks of every size, some
// hashed at once (small, nothing queued), most queued; every digest must equal the SHA-256
// of exactly what was fed to it, in order. Only 3 chunks exist, so the feeder keeps waiting
// for the worker to free one, and small feeds often arrive while their stream has chunks
// queued (they must queue behind them, not be hashed early).
BOOST_AUTO_TEST_CASE(interleaved_streams_hash_exactly_their_bytes_in_order) {
  constexpr size_t kChunk = 4096;
  HashWorker worker(kChunk, 3, 512);
  std::mt19937_64 rng(42);
  constexpr int kStreams = 7;
  std::vector<std::shared_ptr<HashWorker::Digest>> digests;
  std::vector<std::string> fed(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    digests.push_back(std::make_shared<HashWorker::Digest>());
  }
  HashWorker::Chunk chunk = worker.take();
  BOOST_REQUIRE(chunk);
  BOOST_REQUIRE_EQUAL(chunk.capacity(), kChunk);
  std::uniform_int_distribution<size_t> which(0, kStreams - 1);
  std::uniform_int_distribution<size_t> size(0, kChunk);
  std::uniform_int_distribution<size_t> small(1, 600);
  for (int round = 0; round < 4000; ++round) {
    size_t s = which(rng);
    size_t n = (round % 3 == 0) ? small(rng) : size(rng);
    std::string bytes = random_bytes(rng, n);
    std::memcpy(chunk.data(), bytes.data(), n);
    // The worker may still read a queued chunk: scribble on what we get back to catch a
    // chunk handed out twice.
    chunk = worker.feed(digests[s], std::move(chunk), n);
    BOOST_REQUIRE(chunk);
    std::memset(chunk.data(), 0xA5, chunk.capacity());
    fed[s] += bytes;
  }
  worker.give_back(std::move(chunk));
  for (int i = 0; i < kStreams; ++i) {
    BOOST_TEST(hex(worker.finish(*digests[i])) == sha256_hex(fed[i]), "stream " << i);
  }
  // finish() starts the digest over, like Sha256::finish.
  BOOST_TEST(hex(worker.finish(*digests[0])) == sha256_hex(""));
}

// A feed of bytes the caller holds (abandon() re-reads a log from disk) lands after what is
// queued, and reset() drops everything fed so far, queued or not.
BOOST_AUTO_TEST_CASE(feed_now_comes_after_queued_chunks_and_reset_drops_all) {
  HashWorker worker(1 << 16, 2, 0);  // inline limit 0: every chunk is queued
  auto digest = std::make_shared<HashWorker::Digest>();
  std::mt19937_64 rng(7);
  std::string a = random_bytes(rng, 60000), b = random_bytes(rng, 333);
  HashWorker::Chunk chunk = worker.take();
  std::memcpy(chunk.data(), a.data(), a.size());
  chunk = worker.feed(digest, std::move(chunk), a.size());
  worker.feed_now(*digest, b.data(), b.size());
  BOOST_TEST(hex(worker.finish(*digest)) == sha256_hex(a + b));

  std::memcpy(chunk.data(), a.data(), a.size());
  chunk = worker.feed(digest, std::move(chunk), a.size());
  worker.reset(*digest);
  worker.feed_now(*digest, b.data(), b.size());
  BOOST_TEST(hex(worker.finish(*digest)) == sha256_hex(b));
  worker.give_back(std::move(chunk));
}

// A digest dropped by its owner while its chunks are still queued (a job freed mid-capture)
// stays alive until the worker is done with it, and the worker's destructor hashes what is
// queued before it stops: nothing is freed under the worker (ASan checks this in CI).
BOOST_AUTO_TEST_CASE(a_digest_dropped_with_chunks_queued_is_freed_after_the_worker_is_done) {
  std::mt19937_64 rng(3);
  std::string bytes = random_bytes(rng, 1 << 16);
  auto keep = std::make_shared<HashWorker::Digest>();
  std::weak_ptr<HashWorker::Digest> watch;
  {
    HashWorker worker(1 << 16, 4, 0);
    HashWorker::Chunk chunk = worker.take();
    {
      auto dropped = std::make_shared<HashWorker::Digest>();
      watch = dropped;
      for (int i = 0; i < 3; ++i) {
        std::memcpy(chunk.data(), bytes.data(), bytes.size());
        chunk = worker.feed(dropped, std::move(chunk), bytes.size());
      }
    }
    std::memcpy(chunk.data(), bytes.data(), bytes.size());
    chunk = worker.feed(keep, std::move(chunk), bytes.size());
    BOOST_TEST(hex(worker.finish(*keep)) == sha256_hex(bytes));
    // The worker hashes in order, so `dropped`'s chunks are done before `keep`'s was.
    BOOST_TEST(watch.expired());
    worker.give_back(std::move(chunk));
  }
}

// Many feeds larger than the inline limit with a slow consumer cannot grow memory: at most
// `max_chunks` exist, and a feeder that has them all waits for the worker.
BOOST_AUTO_TEST_CASE(chunks_in_flight_are_bounded) {
  HashWorker worker(1 << 20, 2, 0);
  auto digest = std::make_shared<HashWorker::Digest>();
  std::string expected;
  std::string block(1 << 20, 'x');
  HashWorker::Chunk chunk = worker.take();
  std::vector<const char*> seen;
  for (int i = 0; i < 64; ++i) {
    block[static_cast<size_t>(i)] = static_cast<char>('a' + i % 26);
    std::memcpy(chunk.data(), block.data(), block.size());
    expected += block;
    chunk = worker.feed(digest, std::move(chunk), block.size());
    if (std::find(seen.begin(), seen.end(), chunk.data()) == seen.end()) {
      seen.push_back(chunk.data());
    }
  }
  BOOST_TEST(seen.size() <= 2u);
  BOOST_TEST(hex(worker.finish(*digest)) == sha256_hex(expected));
  worker.give_back(std::move(chunk));
}
