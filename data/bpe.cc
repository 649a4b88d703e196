#include "data/bpe.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

#include "base/error.h"

namespace loom::data {

namespace {

constexpr uint32_t kNoMerge = std::numeric_limits<uint32_t>::max();
// Pre-tokens of up to this many symbols merge by scanning a flat array (quadratic, but with no
// heap); longer ones through the heap.
constexpr size_t kFlatMax = 64;

uint64_t mix(uint64_t h) {
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  return h;
}

uint64_t hash_bytes(std::string_view bytes) {
  const char* p = bytes.data();
  size_t n = bytes.size();
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
    h ^= h >> 29;
  }
  return mix(h);
}

size_t table_size(size_t count) {
  size_t size = 16;
  while (size < count * 2) size *= 2;
  return size;
}

}  // namespace

// Bytes -> id, open addressing over an arena of the tokens' bytes.
struct Bpe::Table {
  struct Slot {
    uint32_t hash = 0;
    uint32_t offset = 0;
    uint32_t length = 0;
    int32_t id = -1;  // -1: empty
  };
  std::string arena;
  std::vector<Slot> slots;
  size_t mask = 0;

  explicit Table(const std::vector<std::pair<std::string, int32_t>>& tokens) {
    slots.resize(table_size(tokens.size()));
    mask = slots.size() - 1;
    size_t bytes = 0;
    for (const auto& [token, id] : tokens) bytes += token.size();
    arena.reserve(bytes);
    for (const auto& [token, id] : tokens) {
      const uint64_t h = hash_bytes(token);
      size_t i = h & mask;
      while (slots[i].id >= 0) i = (i + 1) & mask;
      slots[i] = {static_cast<uint32_t>(h >> 32), static_cast<uint32_t>(arena.size()),
                  static_cast<uint32_t>(token.size()), id};
      arena += token;
    }
  }

  int32_t find(std::string_view bytes) const {
    const uint64_t h = hash_bytes(bytes);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots[i];
      if (s.id < 0) return -1;
      if (s.hash == tag && s.length == bytes.size() &&
          std::memcmp(arena.data() + s.offset, bytes.data(), bytes.size()) == 0) {
        return s.id;
      }
    }
  }
};

// (left, right) -> (rank, merged), open addressing.
struct Bpe::MergeTable {
  struct Slot {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  std::vector<Slot> slots;
  size_t mask = 0;

  static uint64_t key_of(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }
  size_t home(uint64_t key) const { return mix(key * 0x9E3779B97F4A7C15ull) & mask; }

  explicit MergeTable(const std::vector<Merge>& merges) {
    slots.resize(table_size(merges.size()));
    mask = slots.size() - 1;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const Merge& m = merges[rank];
      const uint64_t key = key_of(m.left, m.right);
      size_t i = home(key);
      while (slots[i].key != kEmpty && slots[i].key != key) i = (i + 1) & mask;
      slots[i] = {key, static_cast<uint32_t>(rank), m.merged};  // a later duplicate wins
    }
  }

  const Slot* find(int32_t left, int32_t right) const {
    const uint64_t key = key_of(left, right);
    for (size_t i = home(key);; i = (i + 1) & mask) {
      if (slots[i].key == key) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

// Short pre-tokens' ids: 2-way set associative, 64-byte entries, bounded.
class Bpe::Cache {
 public:
  static constexpr size_t kMaxKey = 26;
  static constexpr size_t kMaxIds = 8;

  Cache() : entries_(new Entry[2 * kSets]()) {}

  void clear() { std::fill(entries_.get(), entries_.get() + 2 * kSets, Entry{}); }

  bool get(std::string_view piece, uint64_t h, std::vector<int32_t>& out) const {
    const Entry* set = &entries_[2 * (h & (kSets - 1))];
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (int way = 0; way < 2; ++way) {
      const Entry& e = set[way];
      if (e.hash == tag && e.length == piece.size() &&
          std::memcmp(e.key, piece.data(), piece.size()) == 0) {
        out.insert(out.end(), e.ids, e.ids + e.count);
        return true;
      }
    }
    return false;
  }

  void put(std::string_view piece, uint64_t h, const int32_t* ids, size_t count) {
    if (count > kMaxIds) return;
    Entry* set = &entries_[2 * (h & (kSets - 1))];
    set[1] = set[0];  // the older entry of the set goes
    Entry& e = set[0];
    e.hash = static_cast<uint32_t>(h >> 32);
    e.length = static_cast<uint8_t>(piece.size());
    e.count = static_cast<uint8_t>(count);
    std::memcpy(e.key, piece.data(), piece.size());
    std::memcpy(e.ids, ids, count * sizeof(int32_t));
  }

 private:
  static constexpr size_t kSets = 8192;
  struct Entry {
    uint32_t hash = 0;
    uint8_t length = 0;  // 0: empty (pieces are never empty)
    uint8_t count = 0;
    char key[kMaxKey] = {};
    int32_t ids[kMaxIds] = {};
  };
  static_assert(sizeof(Entry) == 64);
  std::unique_ptr<Entry[]> entries_;
};

namespace {

std::atomic<uint64_t> next_uid{1};

// The caches of the last few models this thread encoded with. A model's id is never reused, so a
// cache left by a destroyed model is only ever recycled.
struct ThreadCaches {
  static constexpr int kSlots = 4;
  uint64_t owners[kSlots] = {};
  std::unique_ptr<Bpe::Cache> caches[kSlots];
  int next = 0;
};

thread_local ThreadCaches thread_caches;

}  // namespace

Bpe::Bpe(const std::vector<std::pair<std::string, int32_t>>& tokens,
         const std::vector<Merge>& merges, Options options)
    : vocab_(std::make_unique<Table>(tokens)),
      merges_(std::make_unique<MergeTable>(merges)),
      options_(options),
      uid_(next_uid.fetch_add(1)) {
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    byte_ids_[b] = vocab_->find(std::string_view(&c, 1));
  }
}

Bpe::~Bpe() = default;

Bpe::Cache* Bpe::thread_cache() const {
  ThreadCaches& t = thread_caches;
  for (int i = 0; i < ThreadCaches::kSlots; ++i) {
    if (t.owners[i] == uid_) return t.caches[i].get();
  }
  const int i = t.next;
  t.next = (t.next + 1) % ThreadCaches::kSlots;
  if (t.caches[i]) {
    t.caches[i]->clear();
  } else {
    t.caches[i] = std::make_unique<Cache>();
  }
  t.owners[i] = uid_;
  return t.caches[i].get();
}

std::optional<int32_t> Bpe::find(std::string_view bytes) const {
  const int32_t id = vocab_->find(bytes);
  if (id < 0) return std::nullopt;
  return id;
}

bool Bpe::lookup(int32_t left, int32_t right, uint32_t& rank, int32_t& merged) const {
  const MergeTable::Slot* slot = merges_->find(left, right);
  if (slot == nullptr) return false;
  rank = slot->rank;
  merged = slot->merged;
  return true;
}

void Bpe::encode(std::string_view piece, Cache* cache, std::vector<int32_t>& out) const {
  if (options_.ignore_merges) {
    const int32_t id = vocab_->find(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (piece.size() == 1 && byte_ids_[static_cast<uint8_t>(piece[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  const bool cacheable = cache != nullptr && piece.size() <= Cache::kMaxKey;
  uint64_t h = 0;
  if (cacheable) {
    h = hash_bytes(piece);
    if (cache->get(piece, h, out)) return;
  }
  // One symbol per byte; bytes missing from the vocabulary become the unknown token (one for a
  // run of them under fuse_unk) or are dropped, as HF's BPE does.
  int32_t small[kFlatMax];
  std::vector<int32_t> large;
  int32_t* ids = small;
  if (piece.size() > kFlatMax) {
    large.resize(piece.size());
    ids = large.data();
  }
  size_t count = 0;
  bool after_unknown = false;
  for (char c : piece) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id >= 0) {
      ids[count++] = id;
      after_unknown = false;
    } else if (options_.unk_id) {
      if (!(after_unknown && options_.fuse_unk)) ids[count++] = *options_.unk_id;
      after_unknown = true;
    }
  }
  const size_t first = out.size();
  merge(ids, count, out);
  if (cacheable) cache->put(piece, h, out.data() + first, out.size() - first);
}

void Bpe::merge(int32_t* ids, size_t n, std::vector<int32_t>& out) const {
  if (n > kFlatMax) {
    merge_long(ids, n, out);
    return;
  }
  // ranks[i], merged[i]: the merge of the pair (ids[i], ids[i + 1]).
  uint32_t ranks[kFlatMax];
  int32_t merged[kFlatMax];
  for (size_t i = 0; i + 1 < n; ++i) {
    if (!lookup(ids[i], ids[i + 1], ranks[i], merged[i])) ranks[i] = kNoMerge;
  }
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == kNoMerge) break;
    ids[best] = merged[best];
    const size_t tail = n - 2 - best;
    std::memmove(ids + best + 1, ids + best + 2, tail * sizeof(int32_t));
    std::memmove(ranks + best, ranks + best + 1, tail * sizeof(uint32_t));
    std::memmove(merged + best, merged + best + 1, tail * sizeof(int32_t));
    --n;
    if (best > 0 && !lookup(ids[best - 1], ids[best], ranks[best - 1], merged[best - 1])) {
      ranks[best - 1] = kNoMerge;
    }
    if (best + 1 < n && !lookup(ids[best], ids[best + 1], ranks[best], merged[best])) {
      ranks[best] = kNoMerge;
    }
  }
  out.insert(out.end(), ids, ids + n);
}

// HF's Word::merge_all: a min-heap of (rank, position) over a linked list of symbols; an entry
// whose pair has changed since it was pushed is skipped when popped.
void Bpe::merge_long(const int32_t* ids, size_t n, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Entry {
    uint32_t rank;
    uint32_t pos;
    int32_t merged;
  };
  const auto later = [](const Entry& a, const Entry& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::vector<Symbol> symbols(n);
  for (size_t i = 0; i < n; ++i) {
    symbols[i] = {ids[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1,
                  true};
  }
  std::vector<Entry> heap;
  heap.reserve(n);
  uint32_t rank;
  int32_t merged;
  for (size_t i = 0; i + 1 < n; ++i) {
    if (lookup(ids[i], ids[i + 1], rank, merged)) {
      heap.push_back({rank, static_cast<uint32_t>(i), merged});
    }
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Entry top = heap.back();
    heap.pop_back();
    Symbol& current = symbols[top.pos];
    if (!current.alive || current.next < 0) continue;
    Symbol& right = symbols[current.next];
    if (!lookup(current.id, right.id, rank, merged) || merged != top.merged) continue;
    current.id = top.merged;
    right.alive = false;
    current.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = static_cast<int32_t>(top.pos);
    if (current.prev >= 0 && lookup(symbols[current.prev].id, current.id, rank, merged)) {
      heap.push_back({rank, static_cast<uint32_t>(current.prev), merged});
      std::push_heap(heap.begin(), heap.end(), later);
    }
    if (current.next >= 0 && lookup(current.id, symbols[current.next].id, rank, merged)) {
      heap.push_back({rank, top.pos, merged});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace loom::data
