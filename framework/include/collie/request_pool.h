// Memory for a backend's request objects that is reused rather than allocated per message.
//
// A backend makes a request for every isend/irecv and the caller drops it after wait(), so
// a small all-reduce would otherwise cost two heap allocations per message. A request type
// that derives from PooledAllocation<T> gets class-specific operator new/delete: a dropped
// request's memory goes onto a free list of its type, and the next request of that type
// takes it from there. Deleting through std::unique_ptr<Request> reaches T's operator delete
// (Request's destructor is virtual), so nothing changes for callers.
//
//   class MyRequest : public Request, public PooledAllocation<MyRequest> { ... };
//
// The list is shared by all threads (a request may be dropped on another thread than the
// one that made it) and keeps at most kMaxFree blocks; a larger subclass, or memory given
// back after the plugin's static objects were destroyed, goes to the global heap.
#pragma once

#include <cstddef>
#include <mutex>
#include <new>

namespace collie {

namespace detail {

// A free list of blocks of one size. Constant-initialised and trivially destructible, so it
// is usable during static initialisation and destruction of the library that holds it.
class BlockPool {
 public:
  static constexpr size_t kMaxFree = 256;

  // A block of `bytes`, from the list when it has one.
  void* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (head_ != nullptr && !closed_) {
        Node* node = head_;
        head_ = node->next;
        --free_;
        return node;
      }
    }
    return ::operator new(bytes < sizeof(Node) ? sizeof(Node) : bytes);
  }

  // Gives a block of `bytes` back: onto the list, or to the heap when the list is full or
  // closed.
  void give(void* block, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_ && free_ < kMaxFree) {
        auto* node = static_cast<Node*>(block);
        node->next = head_;
        head_ = node;
        ++free_;
        return;
      }
    }
    ::operator delete(block, bytes < sizeof(Node) ? sizeof(Node) : bytes);
  }

  // Frees every block on the list; later blocks go straight to the heap. Run when the
  // library holding the pool is unloaded (or the process ends).
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    while (head_ != nullptr) {
      Node* node = head_;
      head_ = node->next;
      ::operator delete(node);
    }
    free_ = 0;
  }

  // How many blocks wait on the list (for tests).
  size_t freeBlocks() {
    std::lock_guard<std::mutex> lock(mu_);
    return free_;
  }

 private:
  struct Node {
    Node* next;
  };
  std::mutex mu_;
  Node* head_ = nullptr;
  size_t free_ = 0;
  bool closed_ = false;
};

// Closes `pool` when the static objects of the library that holds it are destroyed.
class BlockPoolCloser {
 public:
  explicit BlockPoolCloser(BlockPool& pool) : pool_(pool) {}
  ~BlockPoolCloser() { pool_.close(); }
  BlockPoolCloser(const BlockPoolCloser&) = delete;
  BlockPoolCloser& operator=(const BlockPoolCloser&) = delete;

 private:
  BlockPool& pool_;
};

}  // namespace detail

template <class T>
class PooledAllocation {
 public:
  static void* operator new(size_t bytes) {
    if (bytes != sizeof(T)) return ::operator new(bytes);
    static detail::BlockPoolCloser closer(pool_);  // made on first use, destroyed at unload
    return pool_.take(bytes);
  }
  static void operator delete(void* block, size_t bytes) {
    if (bytes != sizeof(T)) return ::operator delete(block, bytes);
    pool_.give(block, bytes);
  }
  // Blocks of T that wait for reuse (for tests).
  static size_t pooledBlocks() { return pool_.freeBlocks(); }

 private:
  static inline detail::BlockPool pool_;
};

}  // namespace collie
