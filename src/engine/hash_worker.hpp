#pragma once

// SHA-256 of captured output on a thread of its own (docs/performance.md, "Capture").
//
// Hashing costs as much CPU as reading the pipe and writing the log together (≈ 0.8 CPU s
// per GiB with SHA-NI, which is as fast as OpenSSL here): on the event-loop thread it capped
// a bulk writer at ≈ 0.45 GB/s. The loop now reads into a chunk, writes it to the log and
// hands the chunk to the worker, which hashes it and returns it to the free list; the loop
// never copies the bytes again and never waits for a hash unless every chunk is queued
// (bounded memory: `max_chunks` × `chunk_bytes`) or it needs a final digest.
//
// Each stream's bytes are hashed in the order they were fed. A small feed with nothing of
// its stream queued is hashed on the caller's thread at once: the usual small job never
// wakes the worker.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/sha256.hpp"

namespace cordon::engine {

class HashWorker {
 public:
  /// A buffer to read into. Move-only; always given back to the worker (feed or give_back).
  class Chunk {
   public:
    Chunk() = default;
    char* data() { return data_.get(); }
    size_t capacity() const { return capacity_; }
    explicit operator bool() const { return data_ != nullptr; }

   private:
    friend class HashWorker;
    std::unique_ptr<char[]> data_;
    size_t capacity_ = 0;
  };

  /// One message's running digest (one log). Shared with the queue, so a Digest dropped with
  /// bytes still queued is freed only after the worker is done with them.
  class Digest {
   public:
    Digest() = default;

   private:
    friend class HashWorker;
    Sha256 sha;
    size_t queued = 0;  // chunks of this digest not hashed yet (under the worker's mutex)
  };

  /// Starts the worker thread.
  HashWorker(size_t chunk_bytes, size_t max_chunks, size_t inline_limit = 64 * 1024);
  HashWorker(const HashWorker&) = delete;
  HashWorker& operator=(const HashWorker&) = delete;
  /// Hashes what is queued, then stops the thread.
  ~HashWorker();

  /// A free chunk; waits while `max_chunks` are in use.
  Chunk take();
  /// Adds the first `n` bytes of `chunk` to `digest`, after everything fed to it before.
  /// Returns a chunk to read into next: `chunk` itself when it was hashed at once, else a free
  /// one (waiting while none is).
  Chunk feed(const std::shared_ptr<Digest>& digest, Chunk chunk, size_t n);
  /// Adds bytes the caller holds (not a chunk), on the caller's thread, after what is queued.
  void feed_now(Digest& digest, const void* data, size_t n);
  /// Gives a chunk back unused.
  void give_back(Chunk chunk);
  /// Waits until every byte fed to `digest` is hashed; returns the digest of them all and
  /// starts it over (like Sha256::finish).
  Sha256::Digest finish(Digest& digest);
  /// Drops what was fed to `digest` (waits for its queued chunks first).
  void reset(Digest& digest);

 private:
  struct Item {
    std::shared_ptr<Digest> digest;
    Chunk chunk;
    size_t n = 0;
  };
  void run();
  void wait_idle(std::unique_lock<std::mutex>& lock, Digest& digest);
  Chunk take_locked(std::unique_lock<std::mutex>& lock);

  const size_t chunk_bytes_, max_chunks_, inline_limit_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // the worker: an item queued, or stop
  std::condition_variable done_cv_;  // callers: a chunk freed, a digest's queue drained
  std::deque<Item> queue_;
  std::vector<Chunk> free_;
  size_t allocated_ = 0;  // chunks in existence (free, queued, or held by a caller)
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cordon::engine
