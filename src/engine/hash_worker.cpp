#include "engine/hash_worker.hpp"

#include <pthread.h>

#include <utility>

namespace cordon::engine {

HashWorker::HashWorker(size_t chunk_bytes, size_t max_chunks, size_t inline_limit)
    : chunk_bytes_(chunk_bytes),
      max_chunks_(max_chunks < 2 ? 2 : max_chunks),
      inline_limit_(inline_limit),
      thread_([this] { run(); }) {
  free_.reserve(max_chunks_);  // the worker's push_back never allocates
}

HashWorker::~HashWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void HashWorker::run() {
  ::pthread_setname_np(::pthread_self(), "cordon-hash");
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) {
      return;  // stop_, and everything queued is hashed
    }
    Item item = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    // Only this thread touches a digest while it has queued chunks (callers wait for
    // `queued` to reach 0 first), and items of one digest leave the queue in order.
    item.digest->sha.update(item.chunk.data(), item.n);
    lock.lock();
    --item.digest->queued;
    free_.push_back(std::move(item.chunk));
    item.digest.reset();
    done_cv_.notify_all();
  }
}

HashWorker::Chunk HashWorker::take_locked(std::unique_lock<std::mutex>& lock) {
  if (free_.empty() && allocated_ < max_chunks_) {
    Chunk c;
    c.data_ = std::make_unique_for_overwrite<char[]>(chunk_bytes_);
    c.capacity_ = chunk_bytes_;
    ++allocated_;  // after the allocation: a bad_alloc must not leave a chunk counted
    return c;
  }
  done_cv_.wait(lock, [this] { return !free_.empty(); });
  Chunk c = std::move(free_.back());
  free_.pop_back();
  return c;
}

HashWorker::Chunk HashWorker::take() {
  std::unique_lock<std::mutex> lock(mu_);
  return take_locked(lock);
}

void HashWorker::give_back(Chunk chunk) {
  if (!chunk) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(chunk));
  }
  done_cv_.notify_all();
}

HashWorker::Chunk HashWorker::feed(const std::shared_ptr<Digest>& digest, Chunk chunk, size_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  if (n == 0) {
    return chunk;
  }
  if (digest->queued == 0 && n <= inline_limit_) {
    lock.unlock();
    // Nothing of this digest is queued, so the worker does not touch it: hash here.
    digest->sha.update(chunk.data(), n);
    return chunk;
  }
  ++digest->queued;
  queue_.push_back(Item{digest, std::move(chunk), n});
  work_cv_.notify_one();
  return take_locked(lock);
}

void HashWorker::wait_idle(std::unique_lock<std::mutex>& lock, Digest& digest) {
  done_cv_.wait(lock, [&] { return digest.queued == 0; });
}

void HashWorker::feed_now(Digest& digest, const void* data, size_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_idle(lock, digest);
  lock.unlock();
  digest.sha.update(data, n);
}

Sha256::Digest HashWorker::finish(Digest& digest) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_idle(lock, digest);
  lock.unlock();
  return digest.sha.finish();
}

void HashWorker::reset(Digest& digest) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_idle(lock, digest);
  lock.unlock();
  digest.sha.reset();
}

}  // namespace cordon::engine
