// Arbitrary integer group ids on the CPU: a hash map from each id to the index of its first occurrence, so a
// group is named by its representative (sort-free, O(B)). Used by group_advantages, the optimal token
// baseline, grpo_passk and opo (csrc/cpu/advantages.cpp, optimal_token_baseline.cpp, outcome_estimators.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rlk {

// id -> index of its first occurrence. Open addressing with linear probing at load <= 1/2.
class FirstIndexMap {
 public:
  explicit FirstIndexMap(int64_t n) {
    size_t cap = 16;
    while (cap < size_t(2 * n)) cap <<= 1;
    mask_ = cap - 1;
    keys_.resize(cap);
    firsts_.assign(cap, -1);
  }

  int64_t first_index(int64_t key, int64_t index) {
    size_t h = mix(uint64_t(key)) & mask_;
    while (true) {
      if (firsts_[h] < 0) {
        keys_[h] = key;
        firsts_[h] = index;
        return index;
      }
      if (keys_[h] == key) return firsts_[h];
      h = (h + 1) & mask_;
    }
  }

 private:
  // splitmix64's finalizer: consecutive ids spread over the whole table.
  static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }

  size_t mask_ = 0;
  std::vector<int64_t> keys_;
  std::vector<int64_t> firsts_;
};

// Each of the b ids' representative: the index of the first element with the same id.
template <typename I>
std::vector<int64_t> representatives(const I* ids, int64_t b) {
  FirstIndexMap map(b);
  std::vector<int64_t> rep(b);
  for (int64_t i = 0; i < b; ++i) rep[i] = map.first_index(int64_t(ids[i]), i);
  return rep;
}

// Dense group numbers 0..G-1 in order of first appearance: group[i] for each of the b ids; returns G.
template <typename I>
int64_t dense_groups(const I* ids, int64_t b, int64_t* group) {
  FirstIndexMap map(b);
  int64_t count = 0;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t first = map.first_index(int64_t(ids[i]), i);
    group[i] = first == i ? count++ : group[first];
  }
  return count;
}

}  // namespace rlk
